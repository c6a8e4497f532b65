"""Helpers shared by the commands: ajet's errors end with a message and an exit code.

The error classes live in `ajet.errors`; the CLI only formats them.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from ajet.env_protocol import TOKEN_ENV
from ajet.errors import AjetError, ConfigError, UserError
from ajet.signals import stop_on_signals
from ajet.training.checkpoint_dir import latest_checkpoint

if TYPE_CHECKING:
    from ajet.config.schema import AjetConfig
    from ajet.service_specs import ServiceSpec

err_console = Console(stderr=True, highlight=False)

# The options every command that runs a config shares.
Conf = Annotated[Path, typer.Option("--conf", "-c", help="The run's YAML config.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Dotted overrides, KEY=VALUE.", show_default=False)]
ExpDir = Annotated[Path | None, typer.Option("--exp-dir", help="Experiment root (overrides project.exp_dir).")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")]
ResumeChanged = Annotated[bool, typer.Option(
    "--resume-changed", help="--resume although the model, the data files or the batch shape differ from "
                             "the ones the run started with (over changed train tasks, the saved epoch goes on "
                             "from their beginning).")]
Fresh = Annotated[bool, typer.Option(
    "--fresh", help="Start a new run where the run directory holds an earlier one: that one is moved to "
                    "RUN.<date-time> first (nothing is deleted).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Plain log lines, no live display.")]


def fresh_start(run_dir: Path | None, *, fresh: bool, resume: bool) -> None:
    """`--fresh` / `--resume`: refuse both at once; with `--fresh`, move an earlier run in
    `run_dir` aside (`ajet.training.run_dir.move_aside`). `run_dir` None (--dry-run): check only."""
    if fresh and resume:
        raise UserError("--fresh starts a new run and --resume continues the earlier one: pass one of them.")
    if fresh and run_dir is not None:
        # imports ajet.config (OmegaConf, ~0.15 s), which `ajet episode --help` does not load
        from ajet.training.run_dir import move_aside

        if moved := move_aside(run_dir):
            typer.echo(f"--fresh: the earlier run is kept in {moved}; starting a new one in {run_dir}")


def config_overrides(overrides: list[str] | None, **options: object) -> list[str]:
    """The user's KEY=VALUE arguments, then one per command option that was given: options are
    dotted keys with `__` for `.` (`project__exp_dir=...`); None or False means not given."""
    extra = list(overrides or [])
    for key, value in options.items():
        if value is None or value is False:
            continue
        extra.append(f"{key.replace('__', '.')}={'true' if value is True else value}")
    return extra


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn ajet's errors into a red message and their exit code, no traceback."""
    try:
        yield
    except ConfigError as exc:
        err_console.print(Text.assemble(("ajet: config error: ", "bold red"), str(exc)), soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except AjetError as exc:
        err_console.print(Text.assemble(("ajet: ", "bold red"), str(exc)), soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None


# The exit code of a run stopped by a signal (as a shell reports Ctrl-C: 128 + SIGINT).
STOPPED_EXIT = 130


@contextmanager
def clean_stop(run_dir: Path, resume_command: str) -> Iterator[None]:
    """Inside: Ctrl-C, SIGTERM and SIGHUP stop the run cleanly (`ajet.signals`); the command
    then says where the run stands and how to continue, and exits 130."""
    try:
        with stop_on_signals():
            yield
    except KeyboardInterrupt as exc:
        runs = [run_dir, *sorted((run_dir / "stages").glob("*"))]  # a pipeline: its stages' runs
        newest = [ckpt for d in runs if (ckpt := latest_checkpoint(d / "checkpoints")) is not None]
        where = f"the newest checkpoint is {newest[-1]}" if newest else "no checkpoint of this run was saved"
        err_console.print(Text.assemble(("ajet: stopped ", "bold red"), f"({str(exc) or 'SIGINT'}); {where}. "
                                        f"Continue with: {resume_command}"), soft_wrap=True)
        raise typer.Exit(STOPPED_EXIT) from None


def env_servers(cfg: AjetConfig) -> dict[str, ServiceSpec]:
    """The server an `env` section needs (verifiers', an OpenEnv package's), with a token of the
    run's own (AJET_ENV_TOKEN, which the adapters send) unless one is set; {} for none."""
    from ajet.service_specs import env_server_specs

    specs = env_server_specs(cfg.env)
    if specs:
        os.environ.setdefault(TOKEN_ENV, secrets.token_urlsafe(24))
    return specs


@contextmanager
def env_servers_running(cfg: AjetConfig, log_dir: Path | None = None) -> Iterator[None]:
    """`env_servers(cfg)` started for the block and stopped after it (`ajet episode`, `ajet eval`:
    a verifiers or OpenEnv YAML works there as it does in training). Their logs go to `log_dir`
    (a temporary folder by default; a server that fails to start names its log)."""
    specs = env_servers(cfg)
    if not specs:
        yield
        return
    from ajet.launcher import Launcher

    with Launcher(env_services=specs, log_dir=log_dir or Path(tempfile.mkdtemp(prefix="ajet-env-servers-"))):
        yield
