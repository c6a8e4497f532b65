"""`ajet sft --conf X.yaml [KEY=VALUE ...]`: supervised fine-tuning on agent dialogs."""

from __future__ import annotations

import typer

from ajet.cli.common import (
    Conf,
    ExpDir,
    Fresh,
    Overrides,
    Quiet,
    Resume,
    ResumeChanged,
    clean_stop,
    config_overrides,
    fresh_start,
    user_errors,
)
from ajet.cli.convert_model import converting_in_background
from ajet.config import load_config
from ajet.config.validate import single_stage_config
from ajet.outputs.setup import configure_logging
from ajet.training.run_dir import run_dir_of

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(
    help=(
        "Fine-tune on the dialogs of sft.train_path (loss on assistant turns only), with the "
        "sft.* settings (coreset, task weights, rounds + replay). KEY=VALUE arguments override the "
        "YAML; pipeline.overrides.sft applies too. The model lands in RUN/final_model."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def sft(conf: Conf, overrides: Overrides = None, exp_dir: ExpDir = None, resume: Resume = False,
        resume_changed: ResumeChanged = False, fresh: Fresh = False, quiet: Quiet = False) -> None:
    with user_errors():
        resume = resume or resume_changed
        extra = config_overrides(overrides, project__exp_dir=exp_dir, logging__quiet=quiet,
                                 project__resume_changed=resume_changed)
        cfg = single_stage_config(load_config(conf, extra, require_workflow=False), "sft")
        fresh_start(run_dir_of(cfg), fresh=fresh, resume=resume)
        configure_logging(cfg.logging.level, quiet=cfg.logging.quiet)
        # The bundled model's first conversion runs beside the imports below (ajet.cli.convert_model).
        with converting_in_background(cfg.model, cfg.logging.level):
            from ajet.sft.recipe import train_sft  # imports torch: not for --help

            with clean_stop(run_dir_of(cfg), f"ajet sft --conf {conf} --resume (and the same overrides)"):
                run_dir = train_sft(cfg, resume=resume)
        typer.echo(f"sft done: {run_dir / 'final_model'}")
