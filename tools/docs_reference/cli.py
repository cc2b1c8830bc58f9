"""The `ftjob` page: each subcommand's usage and options, read off the parsers `ftjob` itself builds.

`finetune_operator.cli.main` builds the top-level parser and lets each command module add its
options to a parser of its own (`configure`); this module does the same and writes what the
parsers hold, so a new option or a changed help text shows up here without anyone editing it.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

from finetune_operator.cli.main import COMMANDS, build_parser

from . import cell

WIDTH = 100  # fixed, so the usage lines do not depend on the terminal that generates them


@contextmanager
def _bare_environment() -> Iterator[None]:
    """No environment variables while the parsers are built: several defaults come from them
    (`ftjob operator` reads FTJOB_*), and the page shows the built-in ones."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=WIDTH)


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        params["prog"] = prog
        text = text % params
    return text


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    return f"`{action.default}`"


def _flags(action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.nargs != 0 and action.option_strings:
        names += f" `{action.metavar or action.dest.upper()}`"
    return names


def command_section(name: str, description: str, parser: argparse.ArgumentParser) -> list[str]:
    parser.formatter_class = _formatter
    lines = [f"## `ftjob {name}`", "", description, "", "```text", parser.format_usage().strip(), "```", ""]
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    if actions:
        lines += ["| Argument | Default | Allowed | Help |", "|---|---|---|---|"]
        for action in actions:
            allowed = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
            help_text = cell(_help(action, parser.prog))
            lines.append(f"| {_flags(action)} | {cell(_default(action))} | {cell(allowed)} | {help_text} |")
        lines.append("")
    return lines


def page() -> str:
    top = build_parser()
    lines = [
        "# `ftjob` command line",
        "",
        cell(top.description or ""),
        "`ftjob` is also installed as `kubectl-ftjob`, so `kubectl ftjob ...` works. Defaults are the built-in "
        "ones: options that say so take their default from an environment variable when it is set.",
        "",
        "| Command | What it does |",
        "|---|---|",
    ]
    lines += [f"| [`ftjob {name}`](#ftjob-{name}) | {cell(text)} |" for name, (_module, text) in COMMANDS.items()]
    lines.append("")
    for name, (module_name, text) in COMMANDS.items():
        module = importlib.import_module(f"finetune_operator.cli.{module_name}")
        parser = argparse.ArgumentParser(prog=f"ftjob {name}", description=text)
        with _bare_environment():
            module.configure(parser)
        lines += command_section(name, text, parser)
    return "\n".join(lines)
