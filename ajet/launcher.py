"""`Launcher`: start what a run needs beside the trainer, and stop exactly that on exit.

    with Launcher(env_services={"kv": spec}, ray="init", ray_address="") as launcher:
        ...                                  # env services healthy, Ray up
        launcher.run_command([...])          # a managed child (e.g. the verl trainer)

- Environment services (`env_services.<name>` in the config, started with
  `--with-env NAME`): each command runs in its own process group; the launcher polls its
  health URL until it answers 2xx (or the process dies, or the timeout passes). A service
  already healthy at its URL is reused, not started, and left running. A service marked
  `restart` (an `env` section's server: `env_server_specs`) is started again when it exits
  during the run.
- vLLM servers (`vllm_servers.<name>`, started with `--with-vllm NAME`): the same, running
  vLLM's OpenAI server on GPUs that were free at start (`vllm_service_specs`).
- Ray: `ray="init"` joins `ray_address` or starts a local Ray inside this process
  (`ray.init`, no dashboard) and shuts it down on exit if it started it; `ray="head"`
  runs `ray start --head --block` as a child (for trainers started as separate processes,
  which find it through RAY_ADDRESS) unless `ray_address` names a cluster to join.
  A Ray that the launcher starts listens on `ray_node_ip` only (`ray.node_ip`, default
  127.0.0.1): Ray runs any code sent to its ports, and on Linux it would otherwise bind them
  on every interface whatever `--node-ip-address` says (`ray_env`).
- Exit (normal, exception, Ctrl-C, or SIGTERM, which is turned into KeyboardInterrupt while
  the launcher is active): children are stopped in reverse start order, SIGTERM to their
  process group, then SIGKILL after a grace period. Nothing it did not start is touched.

What the config names (`ServiceSpec`) is `ajet.service_specs`; Ray's addresses `ajet.ray_env`;
the GPUs `ajet.gpus`.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ajet.config.redact import redact_argv
from ajet.errors import LaunchError
from ajet.net import is_loopback
from ajet.ray_env import keep_ray_local, ray_env, restore_env
from ajet.service_specs import ServiceSpec, service_argv
from ajet.signals import reclaim, stops_the_run

log = logging.getLogger(__name__)


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen
    log_path: Path | None = None
    spec: ServiceSpec | None = None  # an env service's, for a restart


class Launcher:
    def __init__(
        self,
        *,
        env_services: Mapping[str, ServiceSpec] | None = None,
        ray: str | None = None,  # None | "init" | "head"
        ray_address: str = "",
        ray_num_cpus: int | None = None,
        ray_num_gpus: int | None = None,
        ray_node_ip: str = "127.0.0.1",
        log_dir: str | Path | None = None,
        stop_timeout_s: float = 10.0,
    ) -> None:
        if ray not in (None, "init", "head"):
            raise ValueError(f"ray must be None, 'init' or 'head', got {ray!r}")
        self.env_services = dict(env_services or {})
        self.ray_mode = ray
        self.ray_address = ray_address
        self.ray_num_cpus = ray_num_cpus
        self.ray_num_gpus = ray_num_gpus
        self.ray_node_ip = ray_node_ip
        self.log_dir = Path(log_dir) if log_dir else None
        self.stop_timeout_s = stop_timeout_s
        self.children: list[_Child] = []
        self._ray_initialized_here = False
        self._old_sigterm: Any = None
        self._old_ray_env: str | None = None
        self._started_head = False
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self.restarts = 0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Launcher:
        self._install_sigterm()
        try:
            for name, spec in self.env_services.items():
                self.start_service(name, spec)
            if any(spec.restart for spec in self.env_services.values()):
                self._watcher = threading.Thread(target=self._watch, name="launcher-restarts", daemon=True)
                self._watcher.start()
            if self.ray_mode == "init":
                self._ray_init()
            elif self.ray_mode == "head" and not self.ray_address:
                self._ray_head()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop everything this launcher started (idempotent)."""
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=self.stop_timeout_s)
            self._watcher = None
        try:
            if self._ray_initialized_here:
                import ray  # heavy, and launcher.py is on the --dry-run path

                ray.shutdown()
                self._ray_initialized_here = False
                log.info("ray: local instance shut down")
            while self.children:
                child = self.children.pop()
                stop_process_group(child.proc, self.stop_timeout_s, name=child.name)
            if self._old_ray_env is not None:
                restore_env("RAY_ADDRESS", self._old_ray_env)
                self._old_ray_env = None
        finally:
            self._restore_sigterm()

    # ------------------------------------------------------------------ env services
    def start_service(self, name: str, spec: ServiceSpec) -> subprocess.Popen | None:
        """Start `spec` and wait until it is healthy; None when one is already healthy at its
        health URL (reused, and left running on exit)."""
        if spec.health_url and answers_2xx(spec.health_url):
            log.info("service %s: already healthy at %s; reusing it (it is not stopped on exit)",
                     name, spec.health_url)
            return None
        argv = service_argv(spec.command)
        proc = self._spawn(name, argv, cwd=spec.cwd or None, env=spec.env)
        self.children[-1].spec = spec
        log.info("service %s: started (pid %d): %s", name, proc.pid, shlex.join(redact_argv(argv)))  # e.g. --api-key
        wait_healthy(name, proc, spec.health_url, spec.startup_timeout_s, log_path=self.children[-1].log_path)
        return proc

    def _watch(self, poll_s: float = 0.5) -> None:
        """Start again each `restart` service that exited (an environment server that crashed):
        the episodes it was serving fail, the next ones find it back. Until the launcher stops."""
        while not self._stopping.wait(poll_s):
            for child in list(self.children):
                if child.spec is None or not child.spec.restart or child.proc.poll() is None:
                    continue
                log.warning("service %s (pid %d) exited with code %s during the run; starting it again",
                            child.name, child.proc.pid, child.proc.returncode)
                self.children.remove(child)
                try:
                    self.start_service(child.name, child.spec)
                    self.restarts += 1
                except LaunchError as exc:
                    log.error("service %s could not be started again: %s", child.name, exc)

    def run_command(self, argv: Sequence[str], *, name: str = "trainer",
                    env: Mapping[str, str] | None = None) -> int:
        """Run a managed child to completion; on Ctrl-C it is stopped with its group."""
        proc = self._spawn(name, list(argv), env=env, capture=False)
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:
                stop_process_group(proc, self.stop_timeout_s, name=name)

    def _spawn(self, name: str, argv: list[str], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None, capture: bool = True) -> subprocess.Popen:
        log_path = None
        stdout: Any = None
        if capture:
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log_path = self.log_dir / f"{name}.log"
                stdout = open(log_path, "ab")  # noqa: SIM115 - owned by the child's lifetime
            else:
                stdout = subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env={**os.environ, **dict(env or {})}, stdout=stdout,
                stderr=subprocess.STDOUT if capture else None, start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"{name}: cannot start {argv[0]!r}: {exc}") from exc
        finally:
            if hasattr(stdout, "close"):
                stdout.close()
        self.children.append(_Child(name, proc, log_path))
        return proc

    # ------------------------------------------------------------------ ray
    def _ray_init(self) -> None:
        if not self.ray_address:
            keep_ray_local(self.ray_node_ip)  # before `import ray` reads the environment
        import ray  # heavy, and launcher.py is on the --dry-run path

        if ray.is_initialized():
            log.info("ray: already initialised in this process; using it")
            return
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                                  "configure_logging": False}
        if self.ray_address:
            ray.init(address=self.ray_address, **kwargs)
            log.info("ray: joined the cluster at %s", self.ray_address)
        else:
            if not is_loopback(self.ray_node_ip):
                kwargs["_node_ip_address"] = self.ray_node_ip
            # "local": a new instance, never the one /tmp/ray/ray_current_cluster names (Ray's
            # default for address=None joins whatever cluster last ran on this machine)
            ray.init(address="local", num_cpus=self.ray_num_cpus, num_gpus=self.ray_num_gpus, **kwargs)
            log.info("ray: started a local instance (%s CPUs) listening on %s", self.ray_num_cpus or "all",
                     self.ray_node_ip)
        self._ray_initialized_here = True
        reclaim()  # ray.init installs its own SIGTERM handler, which would stop a run mid-update

    def _ray_head(self) -> None:
        port = free_port()
        ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
        if ray_bin is None:
            raise LaunchError("the `ray` command is not installed in this environment: pip install ray")
        argv = [ray_bin, "start", "--head", "--block", f"--port={port}", "--disable-usage-stats",
                "--include-dashboard=false"]
        if self.ray_num_cpus is not None:
            argv.append(f"--num-cpus={self.ray_num_cpus}")
        if self.ray_num_gpus is not None:
            argv.append(f"--num-gpus={self.ray_num_gpus}")
        if not is_loopback(self.ray_node_ip):
            argv.append(f"--node-ip-address={self.ray_node_ip}")
        proc = self._spawn("ray-head", argv, env=ray_env(self.ray_node_ip))
        host = "127.0.0.1" if is_loopback(self.ray_node_ip) else self.ray_node_ip
        address = f"{host}:{port}"
        wait_port("ray-head", proc, host, port, 120.0)
        self._old_ray_env = os.environ.get("RAY_ADDRESS", "")
        os.environ["RAY_ADDRESS"] = address
        self.ray_address = address
        self._started_head = True
        log.info("ray: head node started at %s (pid %d)", address, proc.pid)

    def ray_child_env(self) -> dict[str, str]:
        """Environment for a child process that joins this launcher's Ray (the trinity trainer):
        its address and, for a head started here, the loopback switch (a driver without it
        takes the machine's address and never finds the head's node) and token auth, which
        `ray start --head` turns on (Ray 2.60) and a joiner reads from ~/.ray/auth_token only
        in that mode."""
        if not self.ray_address:
            return {}
        env = {"RAY_ADDRESS": self.ray_address}
        if self._started_head:
            env.update(ray_env(self.ray_node_ip))
            env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "token")
        return env

    # ------------------------------------------------------------------ signals
    def _install_sigterm(self) -> None:
        """SIGTERM stops the launcher's block like Ctrl-C, where nothing else decides it: a run's
        own handler (`ajet.signals`) records the stop and lets an update finish, and an inherited
        "ignore" (nohup) stays."""
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_IGN or stops_the_run(current):
            return

        def _raise(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        self._old_sigterm = signal.signal(signal.SIGTERM, _raise)

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


# ---------------------------------------------------------------------- process helpers
def stop_process_group(proc: subprocess.Popen, timeout_s: float = 10.0, *, name: str = "") -> None:
    """SIGTERM the child's process group, SIGKILL it after `timeout_s` (idempotent)."""
    if proc.poll() is not None:
        return
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored %s", name or "child", proc.pid, sig.name)
    log.info("%s (pid %d) stopped", name or "child", proc.pid)


def answers_2xx(url: str, timeout_s: float = 2.0) -> bool:
    import httpx

    try:
        return 200 <= httpx.get(url, timeout=timeout_s).status_code < 300
    except httpx.HTTPError:
        return False


def wait_healthy(name: str, proc: subprocess.Popen, url: str, timeout_s: float,
                 *, log_path: Path | None = None, poll_s: float = 0.2) -> None:
    """Poll `url` until it answers 2xx; fail if the process exits or time runs out."""
    import httpx

    start = time.monotonic()
    deadline = start + timeout_s
    last = "no answer yet"
    where = f" (its output: {log_path})" if log_path else ""
    while True:
        code = proc.poll()
        if code is not None:
            raise LaunchError(f"service {name} exited with code {code} before it was healthy{where}")
        if not url:
            if time.monotonic() - start >= 1.0:  # no health URL: alive for a second is all we check
                return
        else:
            try:
                response = httpx.get(url, timeout=2.0)
                if 200 <= response.status_code < 300:
                    log.info("service %s: healthy at %s", name, url)
                    return
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise LaunchError(f"service {name} was not healthy at {url} within {timeout_s:.0f} s "
                              f"(last: {last}){where}; check its command and health_url")
        time.sleep(poll_s)


def wait_port(name: str, proc: subprocess.Popen, host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"{name} exited with code {proc.returncode} during start-up")
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.5)
    raise LaunchError(f"{name} did not listen on {host}:{port} within {timeout_s:.0f} s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
