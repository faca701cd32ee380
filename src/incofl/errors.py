"""One-line errors: every bad input is refused in one line that names its key (exit code 2)."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config problem, phrased as one line that names the key."""


EXIT_DIVERGED = 3  # `incofl train`'s exit code for a diverged run (a result, not a crash)


class Diverged(RuntimeError):
    """A run's first non-finite training loss or server weight (fl/engine/divergence.py). Here,
    torch-free, so that the CLI can name it before a run pins its numerics and imports torch."""

    def __init__(self, round_: int, where: str):
        super().__init__(f"diverged in round {round_}: {where}")
        self.round, self.where = round_, where


def key_and_message(err: ValueError) -> str:
    """`key: message` of a ValidationError's first error (or a ValueError's own text)."""
    if not isinstance(err, ValidationError):
        return str(err)
    first = err.errors()[0]
    msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    key = ".".join(str(p) for p in first["loc"])
    return f"{key}: {msg}" if key else msg
