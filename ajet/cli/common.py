"""Helpers shared by the commands: ajet's errors end with a message and an exit code.

The error classes live in `ajet.errors`; the CLI only formats them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.text import Text

from ajet.errors import AjetError

err_console = Console(stderr=True, highlight=False)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn ajet's errors into a red message and their exit code, no traceback."""
    from ajet.config import ConfigError

    try:
        yield
    except ConfigError as exc:
        err_console.print(Text.assemble(("ajet: config error: ", "bold red"), str(exc)), soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except AjetError as exc:
        err_console.print(Text.assemble(("ajet: ", "bold red"), str(exc)), soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
