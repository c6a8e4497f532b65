"""`ajet sft --conf X.yaml [KEY=VALUE ...]`: supervised fine-tuning on agent dialogs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ajet.cli.common import user_errors

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(
    help=(
        "Fine-tune on the dialogs of sft.train_path (loss on assistant turns only), with the "
        "sft.* settings (coreset, task weights, rounds + replay). KEY=VALUE arguments override the "
        "YAML; pipeline.overrides.sft applies too. The model lands in RUN/final_model."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def sft(
    conf: Annotated[Path, typer.Option("--conf", "-c", help="The run's YAML config.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides, KEY=VALUE.", show_default=False)
    ] = None,
    exp_dir: Annotated[
        Path | None, typer.Option("--exp-dir", help="Experiment root (overrides project.exp_dir).")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Plain log lines.")] = False,
) -> None:
    from ajet.config import load_config

    with user_errors():
        extra = list(overrides or [])
        if exp_dir is not None:
            extra.append(f"project.exp_dir={exp_dir}")
        if quiet:
            extra.append("logging.quiet=true")
        cfg = load_config(conf, extra, require_workflow=False)
        from ajet.logging.setup import configure_logging
        from ajet.pipeline import single_stage_config
        from ajet.sft.trainer import train_sft

        cfg = single_stage_config(cfg, "sft")
        configure_logging(cfg.logging.level, quiet=cfg.logging.quiet)
        run_dir = train_sft(cfg, resume=resume)
        typer.echo(f"sft done: {run_dir / 'final_model'}")
