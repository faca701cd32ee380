"""The engine and the generic stages name no method, method family or model: a method's
special cases live in its own module under fl/methods/ (or its layout), reached through the
registry. The import layers themselves are import-linter contracts (pyproject.toml, make lint)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from incofl.models.names import FAMILIES, MODELS
from incofl.registry import METHODS

FL = Path(__file__).resolve().parents[1] / "src" / "incofl" / "fl"
GENERIC = sorted([*FL.glob("engine/*.py"), *FL.glob("stages/*.py"), FL / "contracts.py"])
# "Local" (local training only) is also the generic word for a client's own training.
_METHODS = {name.lower().replace("-", "") for name in METHODS} - {"local"}
# the families' stems, as they appear inside longer names (InCoStep, FedRolex, RolexMean, ...)
_STEMS = {
    "inco",
    "fedavg",
    "prox",
    "scaffold",
    "nova",
    "moon",
    "heterofl",
    "rolex",
    "scalefl",
    "fedpart",
    "fedlag",
    "fedper",
}
FORBIDDEN = sorted(_METHODS | _STEMS | {m.replace("_", "") for m in MODELS} | set(FAMILIES))


_STATEMENT_START = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL)


def code_tokens(text: str) -> list[tuple[int, str]]:
    """(line, token) of every name and string literal of the code; comments and docstrings (a
    string that is a statement of its own) are prose and left out."""
    tokens, previous = [], tokenize.NEWLINE
    stream = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.COMMENT]
    for i, tok in enumerate(stream):
        following = stream[i + 1].type if i + 1 < len(stream) else tokenize.ENDMARKER
        alone = previous in _STATEMENT_START and following == tokenize.NEWLINE
        docstring = tok.type == tokenize.STRING and alone
        if tok.type in (tokenize.NAME, tokenize.STRING) and not docstring:
            tokens.append((tok.start[0], tok.string))
        if tok.type != tokenize.NL:
            previous = tok.type
    return tokens


def named(token: str) -> list[str]:
    """The forbidden names a token holds, case and underscores aside (the package name aside)."""
    plain = re.sub(r"[_\-]", "", token.lower()).replace("incofl", "")
    return [name for name in FORBIDDEN if name in plain]


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(FL)))
def test_the_engine_and_the_stages_name_no_method_family_or_model(path):
    hits = [
        f"{path.name}:{line}: {token} ({', '.join(names)})"
        for line, token in code_tokens(path.read_text())
        if (names := named(token))
    ]
    assert hits == []


def test_the_check_finds_what_it_looks_for():
    """The scan sees names and strings in code, and skips comments and docstrings."""
    code = '"""A FedAvg docstring."""'
    code += '\n\n\ndef f(x):\n    """InCo prose."""\n    return InCoStep(x, "resnet10")  # FedLAG\n'
    found = [(line, names) for line, token in code_tokens(code) if (names := named(token))]
    assert found == [(6, ["inco"]), (6, ["resnet", "resnet10"])]
    assert named("vit_epoch_scale") == ["vit"] and named("mean_over_holders") == [] and named("incofl.fl") == []
    assert {"fedlag", "heterofl", "incoavg", "fedrolex", "scalefl", "resnet110", "preresnet18", "vitd8"} <= set(
        FORBIDDEN
    )


def test_one_engine_two_transports_no_subclass():
    """The simulator and a Flower federation run the same Engine, Server and client side: nothing
    in the package subclasses them (a transport is the only difference; docs/architecture.md)."""
    src = FL.parent
    subclasses = [
        f"{path.relative_to(src)}:{number}: {line.strip()}"
        for path in sorted(src.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*class \w+\((Engine|Server|Clients|RoundFold)\b", line)
    ]
    assert subclasses == []
