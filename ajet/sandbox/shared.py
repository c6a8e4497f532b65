"""The sandbox a run's workflows share, set up from the config's `sandbox` section.

    # in a workflow (sandbox.enabled: true in the YAML)
    from ajet.sandbox import shared_pool
    async with shared_pool().session(files) as box:
        result = await box.arun_python(code)

`configure(cfg.sandbox)` runs at the start of a run (and `check` at --dry-run): it starts one
sandbox to prove it works here, or raises `SandboxUnavailableError` with the cause and the fix,
so a run never starts and then runs model code some other way. The settings travel in an
environment variable, so that workflows in Ray actors or subprocesses find the same sandbox.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from ajet.config.choices import SandboxBackend
from ajet.config.deploy import SandboxConfig
from ajet.sandbox.box import Limits, probe
from ajet.sandbox.pool import SandboxPool, Sessions

ENV = "AJET_SANDBOX"
_lock = threading.Lock()
_pool: Any = None


def limits_of(cfg: SandboxConfig) -> Limits:
    return Limits(wall_s=cfg.wall_s, cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb, processes=cfg.processes,
                  output_bytes=cfg.output_bytes, disk_mb=cfg.disk_mb)


def check(cfg: SandboxConfig) -> str:
    """Start one sandbox (or reach the service) and run a call; a line saying what isolates the
    code, or `SandboxUnavailableError` naming the cause and the fix."""
    if cfg.backend == SandboxBackend.service:
        from ajet.sandbox.service import RemoteSandbox

        box = RemoteSandbox(cfg.service_url, cfg.service_token).start()
        try:
            result = box.run_python("print(6 * 7)")
        finally:
            box.close()
        if result.stdout.strip() != "42":
            from ajet.errors import SandboxUnavailableError

            raise SandboxUnavailableError(f"the sandbox service at {cfg.service_url} could not run a trivial "
                                          f"call: {result.as_tool_text()}")
        return f"sandbox: the service at {cfg.service_url} runs code"
    if cfg.backend == SandboxBackend.ray:
        try:
            import ray  # noqa: F401 - sandbox.backend=ray only
        except ImportError as exc:
            from ajet.errors import SandboxUnavailableError

            raise SandboxUnavailableError(f"sandbox.backend=ray needs Ray ({exc}): pip install 'ajet[ray]'") from exc
    isolation = probe(limits_of(cfg), cfg.python)
    caps = "cgroup v1 pids+memory and rlimits" if isolation.cgroups else "rlimits and the server's process count"
    where = (f" in {cfg.ray_hosts} Ray actor(s) (checked on this node; every node needs bubblewrap)"
             if cfg.backend == SandboxBackend.ray else "")
    return (f"sandbox: bubblewrap ({isolation.bwrap}){where}, no network, read-only system, {caps}; "
            f"python {isolation.python}")


def configure(cfg: SandboxConfig) -> str:
    """`check`, then make `shared_pool()` build its pool from `cfg` (here and in processes this
    one starts)."""
    line = check(cfg)
    os.environ[ENV] = json.dumps({k: (v.value if hasattr(v, "value") else v)
                                  for k, v in vars(cfg).items()})
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
        _pool = None
    return line


def _settings() -> SandboxConfig:
    raw = os.environ.get(ENV)
    if not raw:
        return SandboxConfig()
    values = json.loads(raw)
    values["backend"] = SandboxBackend(values["backend"])
    return SandboxConfig(**values)


class ServicePool(Sessions):
    """Sessions on a sandbox service (sandbox.backend: service): a remote sandbox per episode."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def acquire(self, files: Mapping[str, str | bytes] | None = None) -> Any:
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
                from ajet.sandbox.ray_pool import RayPool

                _pool = RayPool(cfg.ray_hosts, cfg.pool_size, limits_of(cfg), python=cfg.python)
            else:
                _pool = SandboxPool(size=cfg.pool_size, limits=limits_of(cfg), python=cfg.python)
        return _pool
