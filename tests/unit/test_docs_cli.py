"""docs/cli.md's command tables are what scripts/tools/docs_cli.py builds from the CLI's own help now:
every command, every option, with the text `ajet COMMAND --help` prints."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def gen(script: Any) -> Any:
    return script("tools.docs_cli")


def test_the_committed_page_holds_the_help_of_every_command(gen: Any, script: Any) -> None:
    blocks = script("tools.docs_blocks")
    for page, generated in gen.blocks().items():
        text = page.read_text()
        assert blocks.fill(text, gen.MODULE, generated) == text, (
            f"{page.name} is stale: run .venv/bin/python -m scripts.tools.docs_cli")


def test_each_command_has_its_section_and_options(gen: Any) -> None:
    from ajet.cli.main import COMMANDS

    body = gen.commands_block()
    for name in COMMANDS:
        assert f"\n### `ajet {name}`\n" in body and f"](#ajet-{name})" in body, name
    train = body.split("### `ajet train`", 1)[1].split("\n### ", 1)[0]
    for option in ("--conf", "--backbone", "--dry-run", "--resume", "--fresh", "overrides"):
        assert option in train, option
    assert "--help" not in body.split("\n### ", 1)[1]  # the help option itself is not listed
