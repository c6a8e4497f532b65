"""The services a run starts beside the trainer, as the config names them: `ServiceSpec`, and
the `env_services.<name>` (`--with-env NAME`) and `vllm_servers.<name>` (`--with-vllm NAME`)
entries turned into specs (pure; `ajet.launcher.Launcher` starts them)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ajet.errors import ConfigError, LaunchError


@dataclass
class ServiceSpec:
    """One environment service: what `env_services.<name>` in the config holds."""

    command: str
    health_url: str = ""
    startup_timeout_s: float = 60.0
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # Started again by the launcher when it exits during the run (an environment server that
    # crashed: the episodes in flight fail, the next ones find it back).
    restart: bool = False


def service_argv(command: str) -> list[str]:
    """Split a command line; a leading `python`/`python3` becomes this interpreter (pure),
    so `python -m pkg.server` runs in the same environment as ajet."""
    argv = shlex.split(command)
    if not argv:
        raise LaunchError("an env service has an empty command; set env_services.<name>.command")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def configured_entry(configured: Mapping[str, Any], name: str, option: str, section: str,
                     required: str, hint: str) -> Any:
    """`section.name` from the config, which `option NAME` asked for, with its `required`
    field set (pure); ConfigError otherwise."""
    if name not in configured:
        known = ", ".join(sorted(configured)) or "none"
        raise ConfigError(f"{option} {name}: the config has no {section}.{name} "
                          f"(configured: {known}); add {section}.{name}.{required}")
    entry = configured[name]
    if not str(getattr(entry, required)).strip():
        raise ConfigError(f"{section}.{name}.{required} is empty; {hint}")
    return entry


def env_service_specs(configured: Mapping[str, Any], names: Sequence[str]) -> dict[str, ServiceSpec]:
    """The `env_services` entries named by `--with-env`, checked (pure)."""
    specs: dict[str, ServiceSpec] = {}
    for name in names:
        entry = configured_entry(configured, name, "--with-env", "env_services", "command",
                                 "set the command that starts it")
        specs[name] = ServiceSpec(command=entry.command, health_url=entry.health_url,
                                  startup_timeout_s=entry.startup_timeout_s, cwd=entry.cwd,
                                  env=dict(entry.env))
    return specs


def vllm_service_specs(configured: Mapping[str, Any], names: Sequence[str],
                       free: Sequence[int]) -> dict[str, ServiceSpec]:
    """The `vllm_servers` entries named by `--with-vllm`, as services on GPUs taken in order
    from `free` (pure). Each runs vLLM's OpenAI server under `CUDA_VISIBLE_DEVICES` and is
    healthy when `/health` answers."""
    specs: dict[str, ServiceSpec] = {}
    left = list(free)
    for name in names:
        entry = configured_entry(configured, name, "--with-vllm", "vllm_servers", "model",
                                 "set the checkpoint it serves")
        if entry.gpus < 1:
            raise ConfigError(f"vllm_servers.{name}.gpus={entry.gpus}: a vLLM server needs at least one GPU")
        if len(left) < entry.gpus:
            raise LaunchError(f"--with-vllm {name} needs {entry.gpus} free GPU(s); {len(left)} left of "
                              f"{len(free)} free on this machine (a GPU counts as free below 10% memory used)")
        gpus, left = left[: entry.gpus], left[entry.gpus:]
        argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(entry.model),
                "--served-model-name", name, "--host", "127.0.0.1", "--port", str(entry.port),
                "--tensor-parallel-size", str(entry.gpus),
                "--gpu-memory-utilization", str(entry.gpu_memory_utilization)]
        if entry.max_model_len:
            argv += ["--max-model-len", str(entry.max_model_len)]
        specs[f"vllm-{name}"] = ServiceSpec(
            command=shlex.join(argv + [str(a) for a in entry.extra_args]),
            health_url=f"http://127.0.0.1:{entry.port}/health", startup_timeout_s=entry.startup_timeout_s,
            env={"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)},
        )
    return specs


# The server of a verifiers environment: run by path with verifiers' own interpreter.
VERIFIERS_SERVER = Path(__file__).resolve().parent / "envs" / "verifiers_server.py"
ENV_EXTRA_HINT = {"verifiers": "make env-verifiers", "openenv": "make env-openenv (then install the environment's "
                  "package there: .venv-openenv/bin/pip install ...)"}


def env_server_specs(env: Any) -> dict[str, ServiceSpec]:
    """The server an `env` section needs started (pure but for checking its interpreter): a
    verifiers environment's (unless `env.verifiers.url` joins one) and an OpenEnv package's app
    (with `env.openenv.app`, unless `env.openenv.url`); each restarted if it dies."""
    kind = getattr(env.type, "value", env.type)
    if kind == "verifiers" and not env.verifiers.url:
        sub = env.verifiers
        argv = [sub.python, str(VERIFIERS_SERVER), "--port", str(sub.port)]
    elif kind == "openenv" and env.openenv.app and not env.openenv.url:
        sub = env.openenv
        argv = [sub.python, "-m", "uvicorn", sub.app, "--host", "127.0.0.1", "--port", str(sub.port)]
    else:
        return {}
    if not Path(sub.python).is_file():
        raise LaunchError(f"env.{kind}.python={sub.python} does not exist: {kind}'s packages clash with ajet's, "
                          f"so its server runs in an environment of its own; build it with {ENV_EXTRA_HINT[kind]}")
    return {f"env-{kind}": ServiceSpec(command=shlex.join(argv), health_url=f"http://127.0.0.1:{sub.port}/health",
                                       startup_timeout_s=120.0, restart=True)}
