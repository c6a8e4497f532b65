"""Sandboxes in Ray actors (`sandbox.backend: ray`): a run's code runs on the cluster's nodes.

    sandbox: {enabled: true, backend: ray, ray_hosts: 2, pool_size: 4}
    ajet --conf X.yaml --backbone=debug --with-ray      # or a cluster joined with ray.address

`ray_hosts` actors (`SandboxHost`, named `ajet-sandbox-<i>` in the run's own namespace,
`ajet-sandbox-<Ray job id>`) each keep a warm `SandboxPool` of `pool_size` bubblewrap sandboxes
on the node Ray places them on. Every process of the run (the trainer, each rollout worker: the
actors it starts share its job id) that calls `shared_pool()` finds the same hosts by name (the
first to ask starts them), and another run on the same cluster (another job) finds its own, with
its own limits, rather than this run's. Each process spreads its episodes over them, one
sandbox an episode: `RayPool.acquire` hands out a `RaySandbox`, whose calls are the host's actor
calls. The isolation is the host's own (docs/sandbox.md): each node needs bubblewrap and user
namespaces. The hosts take no CPU from Ray's accounting (`num_cpus=0`): the code they run is
capped per call by the sandbox's own limits, not by Ray.
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ajet.errors import SandboxUnavailableError
from ajet.sandbox.box import Limits, RunResult
from ajet.sandbox.pool import SandboxPool, Sessions

NAMESPACE = "ajet-sandbox"  # the prefix: a run's hosts live in `run_namespace(job id)`
HOST_CONCURRENCY = 64  # calls a host serves at once (each episode's are sequential)


def run_namespace(job_id: str) -> str:
    """The Ray namespace of one run's sandbox hosts. A run is a Ray job: its driver and every
    actor it starts (the rollout workers) share the job id, and two runs on one cluster (two
    drivers) have two, so they never share hosts, nor each other's limits."""
    if not job_id:
        raise ValueError("a run's sandbox hosts need its Ray job id, and this process has none")
    return f"{NAMESPACE}-{job_id}"


def host_name(index: int) -> str:
    return f"ajet-sandbox-{index}"


class SandboxHost:
    """A Ray actor holding a warm pool; sandboxes are named by random ids handed to clients."""

    def __init__(self, size: int, limits: dict[str, Any], python: str = "") -> None:
        self.pool = SandboxPool(size=size, limits=Limits(**limits), python=python)
        self.boxes: dict[str, Any] = {}
        self.lock = threading.Lock()

    def ready(self) -> bool:
        return True

    def acquire(self, files: Mapping[str, str | bytes] | None = None) -> str:
        box = self.pool.acquire(files)
        box_id = secrets.token_hex(16)
        with self.lock:
            self.boxes[box_id] = box
        return box_id

    def _box(self, box_id: str) -> Any:
        with self.lock:
            box = self.boxes.get(box_id)
        if box is None:
            raise KeyError(f"no sandbox {box_id} on this host (released?)")
        return box

    def run_python(self, box_id: str, code: str, stdin: str = "") -> dict[str, Any]:
        return self._box(box_id).run_python(code, stdin=stdin).to_dict()

    def run(self, box_id: str, command: str | list[str], stdin: str = "") -> dict[str, Any]:
        return self._box(box_id).run(command, stdin=stdin).to_dict()

    def write_files(self, box_id: str, files: Mapping[str, str | bytes]) -> None:
        self._box(box_id).write_files(files)

    def read_file(self, box_id: str, path: str, max_bytes: int) -> bytes:
        return self._box(box_id).read_file(path, max_bytes)

    def release(self, box_id: str) -> bool:
        with self.lock:
            box = self.boxes.pop(box_id, None)
        if box is not None:
            self.pool.release(box)
        return box is not None

    def held(self) -> int:
        with self.lock:
            return len(self.boxes)


class RaySandbox:
    """One sandbox on a `SandboxHost`: the calls of `Sandbox`, as actor calls."""

    def __init__(self, host: Any, box_id: str) -> None:
        self.host, self.box_id = host, box_id

    def _get(self, ref: Any) -> Any:
        import ray  # sandbox.backend=ray only

        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise SandboxUnavailableError(f"the sandbox host actor died: {exc}") from exc

    def run_python(self, code: str, *, stdin: str = "") -> RunResult:
        return RunResult(**self._get(self.host.run_python.remote(self.box_id, code, stdin)))

    def run(self, command: str | Sequence[str], *, stdin: str = "") -> RunResult:
        cmd = command if isinstance(command, str) else [str(a) for a in command]
        return RunResult(**self._get(self.host.run.remote(self.box_id, cmd, stdin)))

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self._get(self.host.write_files.remote(self.box_id, dict(files)))

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        return self._get(self.host.read_file.remote(self.box_id, path, max_bytes))

    def close(self) -> None:
        if self.box_id:
            self._get(self.host.release.remote(self.box_id))
            self.box_id = ""


class RayPool(Sessions):
    """Sessions on the run's sandbox hosts (started by the first process that asks)."""

    def __init__(self, hosts: int, size: int, limits: Limits, *, python: str = "") -> None:
        import ray  # sandbox.backend=ray only

        if not ray.is_initialized():
            raise SandboxUnavailableError(
                "sandbox.backend=ray runs sandboxes in Ray actors, and Ray is not started in this process: "
                "run with --with-ray (or --with-ray-cluster ADDRESS), or use sandbox.backend=bwrap")
        remote = ray.remote(num_cpus=0, max_concurrency=HOST_CONCURRENCY)(SandboxHost)  # type: ignore[call-overload]
        settings = dataclasses.asdict(limits)
        self.namespace = run_namespace(ray.get_runtime_context().get_job_id())
        self.hosts = [remote.options(name=host_name(i), namespace=self.namespace, get_if_exists=True)
                      .remote(size, settings, python) for i in range(max(1, hosts))]
        try:
            ray.get([host.ready.remote() for host in self.hosts])
        except ray.exceptions.RayActorError as exc:
            raise SandboxUnavailableError(f"sandbox.backend=ray: a sandbox host actor could not start: {exc}") from exc
        self._next = itertools.cycle(self.hosts)
        self._lock = threading.Lock()

    def acquire(self, files: Mapping[str, str | bytes] | None = None) -> RaySandbox:
        import ray  # sandbox.backend=ray only

        with self._lock:
            host = next(self._next)
        return RaySandbox(host, ray.get(host.acquire.remote(dict(files) if files else None)))

    def close(self) -> None:
        pass  # the hosts belong to the process that started them and end with it
