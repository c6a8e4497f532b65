"""`ajet serve --conf X.yaml [KEY=VALUE ...]`: train on episodes that agents run elsewhere.

The run is `ajet train` on the debug backbone (same config, minus `workflow`), except that the
episodes of each step come from clients through the episode API (docs/episode_api.md) instead
of an in-process workflow: `ServedEpisodes` (an `EpisodeBroker` behind a public gateway) is
handed to the trainer as its episode source.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from ajet.cli.common import user_errors
from ajet.errors import UserError

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
    conf: Annotated[Path, typer.Option("--conf", "-c", help="The run's YAML config (model, tasks, judge).")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides, KEY=VALUE.", show_default=False)
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Listen address [default: serve.host].")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port; 0 = a free one [default: serve.port].")] = None,
    exp_dir: Annotated[
        Path | None, typer.Option("--exp-dir", help="Experiment root (overrides project.exp_dir).")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the experiment's last checkpoint.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Plain log lines, no live display.")] = False,
) -> None:
    from ajet.config import load_config

    with user_errors():
        extra = list(overrides or [])
        for key, value in (("serve.host", host), ("serve.port", port), ("project.exp_dir", exp_dir)):
            if value is not None:
                extra.append(f"{key}={value}")
        if quiet:
            extra.append("logging.quiet=true")
        cfg = load_config(conf, extra, require_workflow=False)
        _check(cfg)
        from ajet.backbones.debug.trainer import train
        from ajet.backbones.registry import checked_backbone
        from ajet.logging.setup import configure_logging
        from ajet.rollout.remote import RemoteWorkflow

        checked_backbone("debug", cfg, str(conf))
        configure_logging(cfg.logging.level, quiet=cfg.logging.quiet)
        train(cfg, resume=resume, workflow=RemoteWorkflow(), episode_source=ServedEpisodes.start)


def _check(cfg: Any) -> None:
    from ajet.config.schema import RL_ALGORITHMS

    if cfg.algorithm.name not in RL_ALGORITHMS or cfg.pipeline.stages:
        raise UserError(f"ajet serve trains with RL (grpo, rloo, reinforce_pp, ppo); "
                        f"algorithm.name={cfg.algorithm.name.value} / pipeline.stages are for `ajet train`.", 2)
    if cfg.trainer.val_every:
        raise UserError("trainer.val_every: validation runs a workflow in-process, and `ajet serve` has none; "
                        "set trainer.val_every=0 (evaluate checkpoints with `ajet eval`).", 2)


class ServedEpisodes:
    """The trainer's episode source under `ajet serve`: an `EpisodeBroker` and the public gateway
    that serves its episode API and the per-episode model endpoint."""

    def __init__(self, broker: Any, gateway: Any, token: str) -> None:
        self.broker, self.gateway, self.token = broker, gateway, token

    @classmethod
    def start(cls, recipe: Any) -> ServedEpisodes:
        """Built by the RL recipe at the end of its setup (engine, judge and reader exist)."""
        from ajet.rollout.remote import EpisodeBroker
        from ajet.rollout.sessions import LocalSessionFactory
        from ajet.tuner import Gateway
        from ajet.tuner.episode_api import attach_episode_api

        cfg = recipe.cfg
        engine = recipe.rollout.engine
        gateway = Gateway(cfg.serve.host, cfg.serve.port).start()
        try:
            roles = list(cfg.workflow.trainable_targets) or None
            sessions = LocalSessionFactory(
                engine=engine, chat=recipe.rollout.stack.chat, gateway=gateway, rollout=cfg.rollout,
                context=cfg.context, trainable_roles=roles, model_max_len=recipe.window)
            broker = EpisodeBroker(
                recipe.reader, recipe.judge, sessions, cfg.rollout, batch_size=cfg.trainer.batch_size,
                total_steps=cfg.trainer.total_steps, policy_version=lambda: engine.policy_version,
                max_staleness=cfg.serve.max_staleness, start_step=recipe.loop.step)
            token = attach_episode_api(gateway, broker, cfg.serve.client_token)
            served = cls(broker, gateway, token)
            served.announce(recipe.run_dir, generated=not cfg.serve.client_token)
        except BaseException:
            gateway.stop()
            raise
        return served

    def announce(self, run_dir: Path, *, generated: bool) -> None:
        """Say where the API is; write RUN/serve.json (owner-only: it holds the client token)."""
        root = self.gateway.base_url.removesuffix("/v1")
        info = {"base_url": self.gateway.base_url, "episodes_url": f"{root}/v1/episodes",
                "docs_url": f"{root}/docs", "client_token": self.token}
        path, tmp = run_dir / "serve.json", run_dir / ".serve.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(info, handle, indent=2)
        os.replace(tmp, path)  # clients polling for the file never read half of it
        shown = self.token if generated else "(serve.client_token)"
        typer.echo(f"ajet serve: episode API on {info['episodes_url']} (docs: {info['docs_url']}); "
                   f"client token {shown}; all in {path}", err=True)

    async def next_batch(self, step: int) -> Any:
        return await self.broker.next_batch(step)

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.broker.record_metrics(step, metrics)

    def close(self) -> None:
        try:
            self.broker.close()
        finally:
            self.gateway.stop()
