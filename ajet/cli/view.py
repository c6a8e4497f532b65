"""`ajet view RUN_DIR [--out FILE] [--serve] [--port N]`: a token-level HTML viewer of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ajet.cli.common import user_errors
from ajet.errors import SetupError, UserError
from ajet.outputs.viewer import make_server, write_viewer

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(help="Write a self-contained HTML viewer of a run's token records (trained tokens, advantages, calls).")
def view(
    run_dir: Annotated[Path, typer.Argument(help="The run directory ({project.exp_dir}/{project.name}).")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="HTML file to write [default: RUN_DIR/viewer/index.html].")
    ] = None,
    serve: Annotated[bool, typer.Option("--serve", help="Also serve it on 127.0.0.1 until Ctrl-C.")] = False,
    port: Annotated[int, typer.Option("--port", help="Port for --serve (0 picks a free one).")] = 8000,
) -> None:
    with user_errors():
        if not run_dir.is_dir():
            raise UserError(f"{run_dir} is not a directory; pass a run directory")
        path = write_viewer(run_dir, out)  # a RunDataError is a UserError
        typer.echo(f"wrote {path}")
        if not serve:
            return
        try:
            server = make_server(path, port)
        except OSError as exc:
            raise SetupError(f"cannot serve on 127.0.0.1:{port} ({exc.strerror}); pass another --port") from None
        typer.echo(f"serving on http://127.0.0.1:{server.server_address[1]}/{path.name} (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            typer.echo("stopped")
        finally:
            server.server_close()
