"""`ajet report RUN_DIR [RUN_DIR2 ...] [--out DIR]`: training curves and a summary of runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ajet.cli.common import user_errors
from ajet.errors import UserError
from ajet.outputs.report import write_report

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(help="Plot a run's metrics.jsonl (PNGs + report.html); several runs are overlaid for comparison.")
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories ({project.exp_dir}/{project.name}).")],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Output folder [default: RUN_DIR/report, or RUN_DIR/report_compare for several runs]."),
    ] = None,
) -> None:
    with user_errors():
        for run_dir in run_dirs:
            if not run_dir.is_dir():
                raise UserError(f"{run_dir} is not a directory; pass run directories")
        path = write_report(list(run_dirs), out)  # a RunDataError is a UserError
        typer.echo(f"wrote {path}")
