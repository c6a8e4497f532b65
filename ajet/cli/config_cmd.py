"""`ajet config --defaults | --conf X.yaml [KEY=VALUE ...]`: show configs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ajet.cli.common import user_errors
from ajet.config import defaults_yaml, load_config, to_yaml

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(help="Print every setting with its default, or the resolved config of a YAML.")
def config(
    defaults: Annotated[bool, typer.Option("--defaults", help="Print the shipped defaults.")] = False,
    conf: Annotated[Path | None, typer.Option("--conf", "-c", help="A run's YAML.")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="KEY=VALUE overrides.")] = None,
) -> None:
    with user_errors():
        if defaults or conf is None:
            typer.echo(defaults_yaml(), nl=False)
            return
        typer.echo(to_yaml(load_config(conf, list(overrides or []), require_workflow=False)), nl=False)
