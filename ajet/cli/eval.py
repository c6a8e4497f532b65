"""`ajet eval --conf X.yaml [--model PATH] [--role NAME] [--split val|test|train] [--n K] [KEY=VALUE ...]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ajet.cli.common import (
    Conf,
    ExpDir,
    Overrides,
    config_overrides,
    env_servers_running,
    user_errors,
)
from ajet.cli.convert_model import converting_in_background
from ajet.config import load_config
from ajet.config.validate import single_stage_config
from ajet.models.load import role_adapter_dir
from ajet.outputs.setup import configure_logging
from ajet.training.export import export_checkpoint, training_checkpoint
from ajet.training.run_dir import run_dir_of

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(
    help=(
        "Run the workflow on a task split with a model and report mean reward, success rate, "
        "pass@k, tool-selection F1 (tasks with target_tools), step efficiency (tasks with "
        "optimal_steps) and end-to-end success: a table here, JSON in RUN/eval/eval_<name>.json."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def eval_(
    conf: Conf,
    overrides: Overrides = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help=(
            "Checkpoint dir to evaluate [default: model.path]; also a peft adapter dir, merged into its "
            "base, e.g. RUN/final_model/adapters/<role> of a per-role run; or a training checkpoint, "
            "RUN/checkpoints/step_N (RUN/checkpoints: the newest), exported once to step_N/model/."))
    ] = None,
    role: Annotated[str | None, typer.Option("--role", help=(
        "Evaluate this role's adapter of a per-role run (model.lora.per_role): --model (or model.path) "
        "is its final_model/ or run dir. Every role of the workflow plays with that adapter."))] = None,
    split: Annotated[str | None, typer.Option(
        "--split", help="val, test or train [default: eval.split]. test (task_reader.jsonl.test_path) is "
                        "for reporting, never for choosing settings.")] = None,
    n: Annotated[int | None, typer.Option("--n", help="Episodes per task; pass@n [default: eval.n].")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Report name: RUN/eval/eval_<name>.json.")] = None,
    dialogs: Annotated[Path | None, typer.Option("--dialogs", help=(
        "Also write every episode as an SFT dialog to this JSONL (what `ajet sft` / sft.train_path "
        "reads): e.g. a teacher's sampled dialogs to fine-tune on."))] = None,
    successful_only: Annotated[bool, typer.Option("--successful-only", help=(
        "With --dialogs: only the successful episodes (rejection sampling)."))] = False,
    exp_dir: ExpDir = None,
) -> None:
    with user_errors():
        if successful_only and dialogs is None:
            raise typer.BadParameter("--successful-only filters what --dialogs writes; give --dialogs PATH too")
        path = None if model is None else Path(model).expanduser()
        extra = config_overrides(overrides, model__path=path.resolve() if path and path.exists() else model,
                                 eval__split=split, eval__n=n, eval__name=name, project__exp_dir=exp_dir)
        cfg = load_config(conf, extra, require_workflow=False)
        configure_logging(cfg.logging.level, quiet=True)
        ckpt = training_checkpoint(cfg.model.path)
        if ckpt is not None:
            cfg.model.path = str(export_checkpoint(ckpt))
        if role is not None:
            cfg.model.path = str(role_adapter_dir(cfg.model.path, role).resolve())
        from rich.console import Console

        # The bundled model's first conversion runs beside the imports below (ajet.cli.convert_model).
        with converting_in_background(cfg.model, cfg.logging.level):
            from ajet.eval.runner import evaluate, metrics_table  # imports torch: not for --help

            cfg = single_stage_config(cfg, "eval")
            with env_servers_running(cfg, run_dir_of(cfg) / "services"):  # a verifiers or OpenEnv server
                report = evaluate(cfg, dialogs=dialogs, successful_only=successful_only)
        Console().print(metrics_table([report]))
        typer.echo(f"wrote {report.path}")
