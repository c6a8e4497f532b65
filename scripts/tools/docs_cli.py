"""The command tables of docs/cli.md, generated from the CLI itself: each command's summary, its
usage line and every option and argument with the help text `ajet COMMAND --help` prints.

    .venv/bin/python -m scripts.tools.docs_cli           # rewrite the generated block
    .venv/bin/python -m scripts.tools.docs_cli --check   # exit 1 when the page is stale

It imports each command's module as `ajet COMMAND` does (ajet.cli.main.COMMANDS), which
imports no torch.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer

from scripts.bench.common import REPO
from scripts.tools.docs_blocks import run

PAGE = REPO / "docs" / "cli.md"
MODULE = "scripts.tools.docs_cli"


def cell(text: str, code: bool = False) -> str:
    """`text` on one line, fit for a table cell; outside code, `<...>` escaped (not HTML)."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text if code else text.replace("<", "\\<")


def command_section(name: str, module: str) -> list[str]:
    cmd = typer.main.get_command(importlib.import_module(module).app)
    prog = "ajet" if name == "train" else f"ajet {name}"
    ctx = cmd.make_context(prog, [], resilient_parsing=True)
    usage = " ".join([prog, *cmd.collect_usage_pieces(ctx)])
    lines = [f"### `ajet {name}`", "", cell(cmd.help or ""), "", f"`{usage}`", "",
             "| option or argument | what it does |", "|---|---|"]
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or "--help" in record[0]:
            continue
        lines.append(f"| `{cell(record[0], code=True)}` | {cell(record[1])} |")
    return lines


def commands_block() -> str:
    from ajet.cli.main import COMMANDS

    lines = ["| command | what it does |", "|---|---|"]
    lines += [f"| [`ajet {name}`](#ajet-{name}) | {cell(summary)} |" for name, (_, summary) in COMMANDS.items()]
    for name, (module, _) in COMMANDS.items():
        lines += ["", *command_section(name, module)]
    return "\n".join(lines)


def blocks() -> dict[Path, dict[str, str]]:
    return {PAGE: {"commands": commands_block()}}


if __name__ == "__main__":
    sys.exit(run(blocks(), MODULE, sys.argv[1:], REPO))
