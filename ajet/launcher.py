"""`Launcher`: start what a run needs beside the trainer, and stop exactly that on exit.

    with Launcher(env_services={"kv": spec}, ray="init", ray_address="") as launcher:
        ...                                  # env services healthy, Ray up
        launcher.run_command([...])          # a managed child (e.g. the verl trainer)

- Environment services (`env_services.<name>` in the config, started with
  `--with-env NAME`): each command runs in its own process group; the launcher polls its
  health URL until it answers 2xx (or the process dies, or the timeout passes). A service
  already healthy at its URL is reused, not started, and left running.
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

`visible_gpus` / `free_gpus` answer "can a GPU backbone run here": nvidia-smi when present,
else torch.cuda.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ajet.config.redact import redact_argv
from ajet.errors import ConfigError, LaunchError
from ajet.net import is_loopback
from ajet.signals import reclaim, stops_the_run

log = logging.getLogger(__name__)


@dataclass
class ServiceSpec:
    """One environment service: what `env_services.<name>` in the config holds."""

    command: str
    health_url: str = ""
    startup_timeout_s: float = 60.0
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)


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


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen
    log_path: Path | None = None


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

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Launcher:
        self._install_sigterm()
        try:
            for name, spec in self.env_services.items():
                self.start_service(name, spec)
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
                _restore_env("RAY_ADDRESS", self._old_ray_env)
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
        log.info("service %s: started (pid %d): %s", name, proc.pid, shlex.join(redact_argv(argv)))  # e.g. --api-key
        wait_healthy(name, proc, spec.health_url, spec.startup_timeout_s, log_path=self.children[-1].log_path)
        return proc

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


# ---------------------------------------------------------------------- Ray's addresses
# Ray (2.60, Linux) resolves a loopback --node-ip-address to the machine's own address and binds
# its GCS, raylet and worker ports on every interface; only this switch (meant for laptops, read
# when `ray._private.ray_constants` is imported, and inherited by Ray's child processes) makes it
# use 127.0.0.1 for all of them. Measured with `ss -ltnp`: docs/backbones.md, "--with-ray".
_RAY_LOCAL_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_env(node_ip: str) -> dict[str, str]:
    """Environment for a Ray process that ajet starts (a head, or a trainer that calls
    `ray.init` itself): loopback-only unless `node_ip` names another interface."""
    return {_RAY_LOCAL_SWITCH: "0"} if is_loopback(node_ip) else {}


def keep_ray_local(node_ip: str) -> None:
    """Make a `ray.init` in this process listen on loopback only (see `ray_env`); works also
    when Ray was imported already (the switch is then a module constant it has read)."""
    if not is_loopback(node_ip):
        return
    os.environ[_RAY_LOCAL_SWITCH] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def listening_addresses(pid: int) -> list[str]:
    """`host:port` of every TCP socket that process `pid` and its descendants listen on."""
    import psutil  # Ray's dependency; only tests and diagnostics ask

    found = []
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def _restore_env(key: str, old: str) -> None:
    if old:
        os.environ[key] = old
    else:
        os.environ.pop(key, None)


# ---------------------------------------------------------------------- GPUs
def parse_nvidia_smi(text: str) -> list[dict[str, int]]:
    """Rows of `nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            continue
        index, used, total = map(int, parts)
        gpus.append({"index": index, "used_mib": used, "total_mib": total})
    return gpus


def query_gpus() -> list[dict[str, int]]:
    """The GPUs this process can see, with their memory use (MiB)."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "--query-gpu=index,memory.used,memory.total",
                                  "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            gpus = parse_nvidia_smi(out)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is not None and visible.strip():
                keep = {int(v) for v in visible.split(",") if v.strip().isdigit()}
                gpus = [g for g in gpus if g["index"] in keep]
            elif visible is not None:
                gpus = []
            return gpus
        except (subprocess.SubprocessError, OSError) as exc:
            log.warning("nvidia-smi failed (%s); asking torch.cuda", exc)
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append({"index": i, "used_mib": (total - free) // 2**20, "total_mib": total // 2**20})
    return gpus


def visible_gpus() -> int:
    return len(query_gpus())


def free_gpus(max_used_fraction: float = 0.1, gpus: list[dict[str, int]] | None = None) -> list[int]:
    """Indices of GPUs whose memory is at most `max_used_fraction` used (pure given `gpus`)."""
    gpus = query_gpus() if gpus is None else gpus
    return [g["index"] for g in gpus if g["total_mib"] and g["used_mib"] / g["total_mib"] <= max_used_fraction]


def require_free_gpus(needed: int, backbone: str, max_used_fraction: float = 0.1) -> None:
    """Refuse to start a GPU backbone that would share busy GPUs."""
    gpus = query_gpus()
    free = free_gpus(max_used_fraction, gpus)
    if len(free) < needed:
        busy = [g for g in gpus if g["index"] not in free]
        detail = ", ".join(f"GPU {g['index']}: {g['used_mib']}/{g['total_mib']} MiB used" for g in busy)
        raise LaunchError(
            f"--backbone={backbone} needs {needed} free GPU(s); {len(free)} of {len(gpus)} are free"
            + (f" ({detail})" if detail else "")
            + ". Stop what uses them, choose others with CUDA_VISIBLE_DEVICES, or lower the GPU counts."
        )
