"""docs/commands.md: every `incofl` subcommand and flag, generated from the command-line parser
(`python -m incofl.clidoc > docs/commands.md`), so each flag is documented once, in its help text;
a test fails when the committed file is stale."""

from __future__ import annotations

import argparse

from incofl.cli import build_parser

HEADER = """# `incofl` commands

Generated from the command-line parser (src/incofl/cli.py) by `python -m incofl.clidoc > docs/commands.md`:
edit the help texts there, not this file. Bad input (a config key, a file, a flag) is one line on
stderr and exit code 2; `incofl COMMAND --help` prints the same text.
"""


def _value(action: argparse.Action) -> str:
    """What a flag takes, as argparse's usage writes it (KEY=VALUE [KEY=VALUE ...], {a,b})."""
    if action.nargs == 0:
        return ""
    choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
    name = action.metavar or choices or (action.dest.upper() if action.option_strings else action.dest)
    forms = {None: name, "?": f"[{name}]", "+": f"{name} [{name} ...]", "*": f"[{name} ...]"}
    return forms.get(action.nargs, name)  # type: ignore[arg-type]


def _usage(prog: str, actions: list[argparse.Action]) -> str:
    parts = []
    for a in actions:
        text = " ".join(filter(None, [a.option_strings[0] if a.option_strings else "", _value(a)]))
        parts.append(text if a.required or not a.option_strings else f"[{text}]")
    return " ".join([prog, *parts])


def _section(name: str, summary: str, parser: argparse.ArgumentParser, usage_tail: str = "") -> list[str]:
    """A command's heading, usage and one table row per flag (defaults are in the help texts)."""
    actions = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    lines = [f"## `{name}`", "", summary, "", "```", _usage(name, actions) + usage_tail, "```", ""]
    if actions:
        lines += ["| flag | takes | what |", "| :--- | :--- | :--- |"]
        for a in actions:
            flag = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.dest}` (positional)"
            value = f"`{_value(a)}`" if _value(a) else ""
            text = (a.help or "").replace("|", "\\|").replace("<", "&lt;").rstrip(".") + "."  # as Markdown shows it
            required = " Required." if a.required and a.option_strings else ""
            lines.append(f"| {flag} | {value} | {text}{required} |")
        lines.append("")
    return lines


def _commands(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    """The sections of each subcommand of `parser`, and of theirs (`incofl federation export`)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    lines: list[str] = []
    for sub in subs:
        summaries = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, subparser in sub.choices.items():
            summary = summaries[name][:1].upper() + summaries[name][1:] + "."
            nested = any(isinstance(a, argparse._SubParsersAction) for a in subparser._actions)
            lines += _section(f"{prog} {name}", summary, subparser, " ACTION ..." if nested else "")
            lines += _commands(f"{prog} {name}", subparser)
    return lines


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The reference page of `parser` (default: incofl's) and of each of its subcommands."""
    parser = parser or build_parser()
    lines = [
        HEADER,
        *_section("incofl", "The console script; the subcommands below do the work.", parser, " COMMAND ..."),
        *_commands("incofl", parser),
    ]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
