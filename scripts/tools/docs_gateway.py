"""The field table of docs/gateway.md, generated from the gateway's one declaration of each
chat-completions field (`ajet.tuner.fields.FIELDS`: its status and its row's text).

    .venv/bin/python -m scripts.tools.docs_gateway           # rewrite the generated block
    .venv/bin/python -m scripts.tools.docs_gateway --check   # exit 1 when the page is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

from ajet.tuner.fields import markdown_table
from scripts.bench.common import REPO
from scripts.tools.docs_blocks import run

PAGE = REPO / "docs" / "gateway.md"
MODULE = "scripts.tools.docs_gateway"


def blocks() -> dict[Path, dict[str, str]]:
    return {PAGE: {"fields": markdown_table()}}


if __name__ == "__main__":
    sys.exit(run(blocks(), MODULE, sys.argv[1:], REPO))
