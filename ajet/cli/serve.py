"""`ajet serve --conf X.yaml [KEY=VALUE ...]`: train on episodes that agents run elsewhere.

The run is `ajet train` on the debug backbone (same config, minus `workflow`), except that the
episodes of each step come from clients through the episode API (docs/episode_api.md) instead
of an in-process workflow: `ajet.serve.source.ServedEpisodes` (an `EpisodeBroker` behind a
public gateway) is the trainer's episode source.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

import typer

from ajet.algorithms.registry import get_algorithm, names
from ajet.backbones.registry import all_capabilities, checked_backbone
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
from ajet.config import load_config, to_yaml
from ajet.config.schema import ClientReward
from ajet.errors import UserError
from ajet.outputs.setup import configure_logging
from ajet.training.run_dir import run_dir_of

if TYPE_CHECKING:  # pragma: no cover
    from ajet.config.schema import AjetConfig
    from ajet.rl.recipe import RLRecipe
    from ajet.serve.source import ServedEpisodes

log = logging.getLogger(__name__)

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(
    help=(
        "Train like `ajet train --backbone=debug`, on episodes that clients run anywhere, in any "
        "language, through the episode API on the gateway (POST /v1/episodes, .../finish, "
        ".../abort, GET /v1/status; OpenAPI at /docs). The config needs no workflow."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def serve(
    conf: Conf,
    overrides: Overrides = None,
    host: Annotated[str | None, typer.Option("--host", help="Listen address [default: serve.host].")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port; 0 = a free one [default: serve.port].")] = None,
    exp_dir: ExpDir = None,
    resume: Resume = False,
    resume_changed: ResumeChanged = False,
    fresh: Fresh = False,
    quiet: Quiet = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=(
        "Print the resolved config and what clients see of a task (and what stays on the server), "
        "then exit."))] = False,
) -> None:
    with user_errors():
        resume = resume or resume_changed
        extra = config_overrides(overrides, serve__host=host, serve__port=port, project__exp_dir=exp_dir,
                                 logging__quiet=quiet, project__resume_changed=resume_changed)
        cfg = load_config(conf, extra, require_workflow=False)
        _check(cfg)
        if dry_run:
            typer.echo(to_yaml(cfg), nl=False)
            typer.echo("".join(f"# {line}\n" for line in task_visibility(cfg)), nl=False)
            return
        from ajet.rl.recipe import train  # imports torch: not for --help
        from ajet.serve.broker import RemoteWorkflow  # pydantic, httpx (~0.25 s): not for --help

        checked_backbone(serving_backbone(), cfg, str(conf))
        fresh_start(run_dir_of(cfg), fresh=fresh, resume=resume)
        configure_logging(cfg.logging.level, quiet=cfg.logging.quiet)
        with clean_stop(run_dir_of(cfg), f"ajet serve --conf {conf} --resume (and the same overrides)"):
            train(cfg, resume=resume, workflow=RemoteWorkflow(), episode_source=served_episodes)


def serving_backbone() -> str:
    """The backbone whose capabilities include `serve` (the debug backbone: the engine and the
    trainer in this process, which the episode API's clients call)."""
    return next(name for name, caps in all_capabilities().items() if caps.serve)


def served_episodes(recipe: RLRecipe) -> ServedEpisodes:
    """The RL recipe's episode source under `ajet serve`, built at the end of its setup."""
    # imports agentscope: not for `ajet serve --help`
    from ajet.serve.source import ServedEpisodes

    return ServedEpisodes.start(
        recipe.cfg, rollout=recipe.rollout, reader=recipe.reader, judge=recipe.judge, run_dir=recipe.run_dir,
        start_step=recipe.training_loop.step, announce=lambda text: typer.echo(text, err=True))


def task_visibility(cfg: AjetConfig) -> list[str]:
    """What a client sees of the train tasks, and which of their metadata keys stay private."""
    from ajet.task_reader.build import build_reader  # pydantic, httpx (~0.4 s): --dry-run only

    tasks = build_reader(cfg.task_reader, seed=cfg.project.seed, env=cfg.env).train_tasks()
    keys = sorted({key for task in tasks for key in task.metadata})
    public = [k for k in keys if k in cfg.serve.public_metadata_keys]
    return [f"clients see: task_id, main_query, init_messages, env_type, metadata {public or 'none'} "
            "(serve.public_metadata_keys)",
            f"stays on the server: metadata {[k for k in keys if k not in public] or 'none'} "
            f"(of {len(tasks)} train tasks)"]


def _check(cfg: AjetConfig) -> None:
    if get_algorithm(cfg.algorithm.name).recipe != "rl" or cfg.pipeline.stages:
        raise UserError(f"ajet serve trains with RL ({', '.join(names(recipe='rl'))}); "
                        f"algorithm.name={cfg.algorithm.name} / pipeline.stages are for `ajet train`.", 2)
    if cfg.judge.type == "group_rank":
        raise UserError("judge.type=group_rank scores a group once all its episodes have ended, but the "
                        "episode API gives each episode its reward when it finishes; with `ajet serve`, "
                        "finish episodes with a reward or use a per-episode judge (e.g. judge.type=llm).", 2)
    if cfg.serve.client_reward is ClientReward.refuse and cfg.judge.type == "none":
        raise UserError("serve.client_reward=refuse with judge.type=none: no episode could get a reward; "
                        "set judge.type (the judge scores what clients send in `metadata`) or "
                        "serve.client_reward=auto.", 2)
    if cfg.trainer.val_every:
        raise UserError("trainer.val_every: validation runs a workflow in-process, and `ajet serve` has none; "
                        "set trainer.val_every=0 (evaluate checkpoints with `ajet eval`).", 2)
