"""`ajet [train] --conf X.yaml --backbone debug|trinity|verl [KEY=VALUE ...]`."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ajet.backbones.registry import checked_backbone
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
    env_servers,
    fresh_start,
    user_errors,
)
from ajet.cli.convert_model import converting_in_background
from ajet.cli.main import commands_epilog
from ajet.cli.preflight import preflight
from ajet.config import load_config, to_yaml
from ajet.config.choices import Backbone
from ajet.errors import LaunchError
from ajet.gpus import free_gpus
from ajet.launcher import Launcher
from ajet.outputs.setup import configure_logging
from ajet.outputs.summary import render_summary, summarize_run
from ajet.service_specs import env_service_specs, vllm_service_specs
from ajet.training.run_dir import run_dir_of

if TYPE_CHECKING:  # pragma: no cover
    from ajet.config.schema import AjetConfig
    from ajet.service_specs import ServiceSpec

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(
    help=(
        "Train the model behind an agent workflow. KEY=VALUE arguments override the YAML "
        "(e.g. trainer.total_steps=5 rollout.n=8)."
    ),
    epilog=commands_epilog(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def train(
    conf: Conf,
    overrides: Overrides = None,
    backbone: Annotated[
        Backbone,
        typer.Option(help="debug: one process, CPU or one GPU. trinity / verl: GPU clusters. tinker: a Tinker service (docs/tinker.md)."),
    ] = Backbone.debug,
    with_ray: Annotated[
        bool, typer.Option("--with-ray", help="Start (or join ray.address) a Ray cluster; rollout runs in Ray actors.")
    ] = False,
    with_ray_cluster: Annotated[
        str | None,
        typer.Option("--with-ray-cluster", metavar="ADDR", help="Join the Ray cluster at ADDR (sets ray.address; implies --with-ray)."),
    ] = None,
    with_env: Annotated[
        list[str] | None,
        typer.Option("--with-env", metavar="NAME", help="Start env_services.NAME before training, stop it after (repeatable)."),
    ] = None,
    with_vllm: Annotated[
        list[str] | None,
        typer.Option("--with-vllm", metavar="NAME", help="Start vllm_servers.NAME (vLLM on free GPUs) before training, stop it after (repeatable)."),
    ] = None,
    exp_dir: ExpDir = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Load and validate the config, import the workflow and judge, find the model; print the resolved config and exit.")
    ] = False,
    resume: Resume = False,
    resume_changed: ResumeChanged = False,
    fresh: Fresh = False,
    quiet: Quiet = False,
) -> None:
    with user_errors():
        resume = resume or resume_changed
        extra = config_overrides(overrides, project__exp_dir=exp_dir, logging__quiet=quiet,
                                 ray__address=with_ray_cluster, project__resume_changed=resume_changed)
        with_ray = with_ray or bool(with_ray_cluster)
        cfg = load_config(conf, extra)
        if not dry_run:
            configure_logging(cfg.logging.level, quiet=cfg.logging.quiet)
        runner = checked_backbone(backbone.value, cfg, str(conf), with_ray=with_ray)
        services = env_service_specs(cfg.env_services, with_env or [])
        if not dry_run:
            services.update(env_servers(cfg))
        if with_vllm and not dry_run:
            services.update(vllm_services(cfg, with_vllm))
        fresh_start(None if dry_run else run_dir_of(cfg), fresh=fresh, resume=resume)
        if dry_run:
            checked = preflight(cfg)
            typer.echo("# resolved ajet config")
            typer.echo(to_yaml(cfg))
            translated = runner.translate(cfg)
            if translated is not None:
                typer.echo(f"# translated {backbone.value} config")
                typer.echo(translated)
            typer.echo("".join(f"# checked: {line}\n" for line in checked), nl=False)
            return
        # The bundled model's first conversion runs beside the imports below (ajet.cli.convert_model),
        # where the backbone loads the model (not a Tinker service's).
        converting = (converting_in_background(cfg.model, cfg.logging.level) if runner.CAPABILITIES.local_model
                      else contextlib.nullcontext())
        with converting:
            from ajet.pipeline import run  # imports torch: not for --help / --dry-run

            start = time.monotonic()
            launched = (Launcher(env_services=services, log_dir=run_dir_of(cfg) / "services") if services
                        else contextlib.nullcontext())
            with launched, clean_stop(run_dir_of(cfg), f"ajet --conf {conf} --resume (and the same overrides)"):
                run(cfg, runner, backbone=backbone.value, with_ray=with_ray, resume=resume)
        print_summary(run_dir_of(cfg), time.monotonic() - start)


def print_summary(run_dir: Path, wall_s: float) -> None:
    """The end of every run: val success before -> after, agent metrics, wall time, and the
    commands that open the token viewer and the report (runs that logged nothing here, e.g. on
    the GPU backbones, print none)."""
    if not ((run_dir / "metrics.jsonl").is_file() or (run_dir / "pipeline.json").is_file()):
        return
    render_summary(summarize_run(run_dir, wall_s=wall_s))


def vllm_services(cfg: AjetConfig, names: list[str]) -> dict[str, ServiceSpec]:
    """`--with-vllm`: specs for the named vLLM servers on this machine's free GPUs."""
    import importlib.util


    if importlib.util.find_spec("vllm") is None:
        raise LaunchError("--with-vllm needs the vllm package in this environment: pip install vllm "
                          "(the GPU environments have it: make env-trinity GPU=1 / make env-verl GPU=1)")
    return vllm_service_specs(cfg.vllm_servers, names, free_gpus())
