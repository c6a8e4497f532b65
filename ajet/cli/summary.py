"""`ajet summary RUN_DIR [--wall-s S]`: what a finished run achieved, and how to look at it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ajet.cli.common import user_errors
from ajet.errors import UserError
from ajet.outputs.summary import render_summary, summarize_run

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(help="Print a run's summary: val success before -> after, agent tool use, wall time, "
                  "and the commands that open its token viewer and report.")
def summary(
    run_dir: Annotated[Path, typer.Argument(help="A run directory ({project.exp_dir}/{project.name}), "
                                                 "a training run or a pipeline.")],
    wall_s: Annotated[
        float | None, typer.Option("--wall-s", help="Wall time to show [default: from the run's records].")
    ] = None,
) -> None:
    with user_errors():
        if not run_dir.is_dir():
            raise UserError(f"{run_dir} is not a directory; pass a run directory")
        render_summary(summarize_run(run_dir, wall_s=wall_s))  # a RunDataError is a UserError
