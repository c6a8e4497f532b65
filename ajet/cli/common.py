"""Helpers shared by the commands: user errors end with a message and an exit code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.text import Text

err_console = Console(stderr=True, highlight=False)

EXIT_CONFIG = 2  # bad config / bad input (like a usage error)
EXIT_RUNTIME = 1  # the environment cannot run this (no GPU, missing extra, ...)


class UserError(Exception):
    """An error the user can fix; printed without a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_RUNTIME) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn config and user errors into a red message and an exit code, no traceback."""
    from ajet.config import ConfigError
    from ajet.errors import AjetUserError

    try:
        yield
    except ConfigError as exc:
        err_console.print(Text.assemble(("ajet: config error: ", "bold red"), str(exc)), soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except AjetUserError as exc:
        err_console.print(Text.assemble(("ajet: ", "bold red"), str(exc)), soft_wrap=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except UserError as exc:
        err_console.print(Text.assemble(("ajet: ", "bold red"), str(exc)), soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
