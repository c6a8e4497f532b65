"""The sandbox a run's workflows share, set up from the config's `sandbox` section.

    # in a workflow (sandbox.enabled: true in the YAML)
    from ajet.sandbox import shared_pool
    async with shared_pool().session(files) as box:
        result = await box.arun_python(code)

`configure(cfg.sandbox)` runs at the start of a run (and `check` at --dry-run): it starts one
sandbox to prove it works here, or raises `SandboxUnavailableError` with the cause and the fix,
so a run never starts and then runs model code some other way. The settings travel in an
environment variable, so that workflows in Ray actors or subprocesses find the same sandbox;
the service token does not (every process this one starts inherits its environment): it is in a
file only this user can read, whose path travels instead.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from ajet.config.choices import SandboxBackend
from ajet.config.deploy import SandboxConfig
from ajet.errors import SandboxUnavailableError
from ajet.sandbox.box import Limits, probe
from ajet.sandbox.pool import SandboxPool, Sessions
from ajet.sandbox.ray_pool import RayPool

ENV = "AJET_SANDBOX"
TOKEN_FILE_ENV = "AJET_SANDBOX_TOKEN_FILE"  # the path of a 0600 file holding sandbox.service_token
_lock = threading.Lock()
_pool: Any = None


def limits_of(cfg: SandboxConfig) -> Limits:
    return Limits(wall_s=cfg.wall_s, cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb, processes=cfg.processes,
                  output_bytes=cfg.output_bytes, disk_mb=cfg.disk_mb)


def check(cfg: SandboxConfig) -> str:
    """Start one sandbox (or reach the service) and run a call; a line saying what isolates the
    code, or `SandboxUnavailableError` naming the cause and the fix."""
    if cfg.backend == SandboxBackend.service:
        # imports fastapi and ajet.tuner (agentscope): only for sandbox.backend=service
        from ajet.sandbox.service import RemoteSandbox

        box = RemoteSandbox(cfg.service_url, cfg.service_token).start()
        try:
            result = box.run_python("print(6 * 7)")
        finally:
            box.close()
        if result.stdout.strip() != "42":
            raise SandboxUnavailableError(f"the sandbox service at {cfg.service_url} could not run a trivial "
                                          f"call: {result.as_tool_text()}")
        return f"sandbox: the service at {cfg.service_url} runs code"
    if cfg.backend == SandboxBackend.ray:
        try:
            import ray  # noqa: F401 - sandbox.backend=ray only
        except ImportError as exc:
            raise SandboxUnavailableError(f"sandbox.backend=ray needs Ray ({exc}): pip install 'ajet[ray]'") from exc
    isolation = probe(limits_of(cfg), cfg.python)
    caps = (f"cgroup {isolation.cgroups} pids+memory, rlimits" if isolation.cgroups
            else "rlimits, the server's process count")
    caps += ", a seccomp filter"
    where = (f" in {cfg.ray_hosts} Ray actor(s) (checked on this node; every node needs bubblewrap)"
             if cfg.backend == SandboxBackend.ray else "")
    return (f"sandbox: bubblewrap ({isolation.bwrap}){where}, no network, read-only system, {caps}; "
            f"python {isolation.python}")


def configure(cfg: SandboxConfig) -> str:
    """`check`, then make `shared_pool()` build its pool from `cfg` (here and in processes this
    one starts)."""
    line = check(cfg)
    values = {k: (v.value if hasattr(v, "value") else v) for k, v in vars(cfg).items()}
    token, values["service_token"] = values["service_token"], ""
    os.environ[ENV] = json.dumps(values)
    if token:
        os.environ[TOKEN_FILE_ENV] = _write_token(token)
    else:
        os.environ.pop(TOKEN_FILE_ENV, None)
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
        _pool = None
    return line


def _write_token(token: str) -> str:
    """`token` in a new file that only this user can read (in a 0700 directory, removed at exit)."""
    folder = tempfile.mkdtemp(prefix="ajet-sandbox-")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "service_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w") as fh:
        fh.write(token)
    return path


def _settings() -> SandboxConfig:
    raw = os.environ.get(ENV)
    if not raw:
        return SandboxConfig()
    values = json.loads(raw)
    values["backend"] = SandboxBackend(values["backend"])
    if token_file := os.environ.get(TOKEN_FILE_ENV):
        try:
            with open(token_file) as fh:
                values["service_token"] = fh.read()
        except OSError as exc:
            raise SandboxUnavailableError(
                f"the sandbox service token file {token_file} ({TOKEN_FILE_ENV}) cannot be read here: {exc}. "
                "It is written on the node that starts the run; a process on another node needs the "
                "same file at that path") from exc
    return SandboxConfig(**values)


class ServicePool(Sessions):
    """Sessions on a sandbox service (sandbox.backend: service): a remote sandbox per episode."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def acquire(self, files: Mapping[str, str | bytes] | None = None) -> Any:
        # imports fastapi and ajet.tuner (agentscope): only for sandbox.backend=service
        from ajet.sandbox.service import RemoteSandbox

        box = RemoteSandbox(self.url, self.token).start()
        if files:
            box.write_files(files)
        return box

    def close(self) -> None:
        pass


def shared_pool() -> Any:
    """This process's pool (a `SandboxPool`; a `ServicePool` for sandbox.backend=service; a
    `RayPool` for sandbox.backend=ray), built on first use from the run's settings."""
    global _pool
    with _lock:
        if _pool is None:
            cfg = _settings()
            if cfg.backend == SandboxBackend.service:
                _pool = ServicePool(cfg.service_url, cfg.service_token)
            elif cfg.backend == SandboxBackend.ray:
                _pool = RayPool(cfg.ray_hosts, cfg.pool_size, limits_of(cfg), python=cfg.python)
            else:
                _pool = SandboxPool(size=cfg.pool_size, limits=limits_of(cfg), python=cfg.python)
        return _pool
