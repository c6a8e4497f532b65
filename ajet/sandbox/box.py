"""One sandbox for model-written code: bubblewrap around a warm fork server (`inside.py`).

    box = Sandbox(Limits(wall_s=5)).start()
    box.write_files({"data.txt": "1 2 3"})
    result = box.run_python("print(sum(map(int, open('data.txt').read().split())))")
    result.status, result.stdout          # "ok", "6\\n"
    box.close()

What is isolated (bubblewrap, `--unshare-all`; docs/sandbox.md):
- no network: a network namespace of its own with only loopback;
- a throwaway filesystem: /sandbox (the work dir), /tmp and /dev/shm are size-capped tmpfs that
  die with the sandbox; /usr and the interpreter's prefix are read-only, the root and /dev are
  read-only, and nothing else of the host (/etc, /home, /root, the repository) is there;
- no secret of the host: the code's environment is set afresh (`--clearenv`), and bubblewrap
  itself starts with an environment of PATH and LANG only;
- an unprivileged user (uid 65534, no capabilities), its own PID namespace and session, no
  further user namespaces (`--disable-userns` where bubblewrap has it) and a seccomp filter
  (`seccomp.py`: no ptrace, no new namespaces, no mounts, no memfds or SysV shared memory);
- a server the code cannot reach: it is the namespace's pid 1 (`--as-pid-1`: no reaper of
  bubblewrap's, which ran as the code's uid and was dumpable, so code could write itself into
  it through /proc/1/mem), it is not dumpable (no /proc/1/fd, mem, environ or ptrace for the
  code), it keeps no signal handler (the kernel drops the code's signals to a pid 1 without
  one: the code cannot kill it), its pipes to the host are extra descriptors, and every answer
  must echo its request's random nonce, else the sandbox is dropped;
- per call: CPU seconds, address space, file size and open files as rlimits, the wall clock,
  the output size and the number of processes enforced by the server, and every process of
  the namespace killed (and reaped: the server is their pid 1) when the call ends. Where this
  process may create cgroups (v1, or a delegated v2 subtree: `cgroups.py`), the sandbox also
  gets `pids.max` and a memory limit over all its processes (`Isolation.cgroups`).

Nothing here falls back to running code without the sandbox: where bubblewrap cannot start, the
error names the cause and the fix (or run the sandbox on another machine: `ajet.sandbox.service`).
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import os
import re
import secrets
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ajet.errors import SandboxUnavailableError
from ajet.sandbox import cgroups, seccomp

INSIDE = Path(__file__).with_name("inside.py")
INSIDE_AT = "/opt/ajet/inside.py"
RELAY = Path(__file__).with_name("relay.py")
RELAY_AT = "/opt/ajet/relay.py"  # a TCP <-> Unix-socket relay: the one way out (`bridge.ModelBridge`)
_ids = itertools.count()


@dataclass(frozen=True)
class Limits:
    """Caps on one call (wall, CPU, memory, processes, output) and on the sandbox's disk."""

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 512  # address space per process (and the cgroup's total, when there is one)
    processes: int = 32
    output_bytes: int = 16_384  # stdout + stderr of one call; more ends the call
    disk_mb: int = 64  # /sandbox; /tmp gets the same again
    # memory_mb as each process's address space (RLIMIT_AS). Off for runtimes that reserve far
    # more address space than they use (Bun, the JVM, Go: a CLI coding agent); the cgroup's
    # memory limit over the whole sandbox still holds where there is one (`Isolation.cgroups`).
    address_space: bool = True


# A failed call whose stderr shows the sandbox saying no (a read-only or hidden path, no
# network, no permission, no more processes) is counted as refused.
_REFUSED = re.compile(
    r"Read-only file system|Permission denied|Operation not permitted|Network is unreachable|"
    r"Connection refused|Temporary failure in name resolution|Name or service not known|"
    r"Resource temporarily unavailable|No such file or directory: '/(?!sandbox/|tmp/)|"
    r"(?<![\w.])'?/(?!sandbox/|tmp/)[^\s:']*'?(?: for reading)?: No such file or directory"  # a shell's: cat: /etc/shadow: ...
)
_OOM = re.compile(r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory")


@dataclass
class RunResult:
    """What one call did. `status`: ok, error (the code failed on its own), timeout, oom,
    output_limit, refused (the sandbox said no: a hidden or read-only path, the network, the
    process cap) or crashed (the sandbox itself died; the next call gets a fresh one)."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float = 0.0
    cpu_s: float = 0.0
    output_bytes: int = 0
    leftover: int = 0  # processes still alive when the call ended (all killed)
    signal: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_tool_text(self, max_chars: int = 2000) -> str:
        """The result as the model reads it: output, then what went wrong, if anything."""
        text = self.stdout
        if self.stderr.strip():
            text += ("\n" if text and not text.endswith("\n") else "") + self.stderr
        if len(text) > max_chars:
            text = text[: max_chars // 2] + "\n...[cut]...\n" + text[-max_chars // 2:]
        if self.status != "ok":
            note = {"error": f"exit code {self.exit_code}", "timeout": "stopped: time limit",
                    "oom": "stopped: memory limit", "output_limit": "stopped: output limit",
                    "refused": "refused by the sandbox", "crashed": "the sandbox died"}[self.status]
            text += ("\n" if text else "") + f"[{note}{': ' + self.detail if self.detail else ''}]"
        return text.strip() or "(no output)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def classify(raw: Mapping[str, Any], limits: Limits) -> RunResult:
    """A `RunResult` from the server's answer."""
    verdict, stderr, exit_code, sig = raw["verdict"], raw["stderr"], raw["exit_code"], raw["signal"]
    detail = ""
    if verdict == "output_limit":
        status, detail = "output_limit", f"more than {limits.output_bytes} bytes of output"
    elif verdict == "timeout":
        status, detail = "timeout", f"{limits.wall_s:g} s wall clock"
    elif verdict == "process_limit":
        status, detail = "refused", f"more than {limits.processes} processes"
    elif sig in (24, 9) and raw["cpu_s"] >= limits.cpu_s - 0.5:  # SIGXCPU, or SIGKILL at the hard cap
        status, detail = "timeout", f"{limits.cpu_s:g} s of CPU"
    elif exit_code == 0:
        status = "ok"
    elif _OOM.search(stderr):
        status, detail = "oom", f"{limits.memory_mb} MB"
    elif refusal := _REFUSED.search(stderr):
        status, detail = "refused", refusal.group(0)
    else:
        status = "error"
    return RunResult(status=status, exit_code=exit_code, stdout=raw["stdout"], stderr=stderr,
                     wall_s=raw["wall_s"], cpu_s=raw["cpu_s"], output_bytes=raw["output_bytes"],
                     leftover=raw["leftover"], signal=sig, detail=detail)


@dataclass
class Isolation:
    """What this host gives a sandbox (`probe`); `--dry-run` prints it."""

    bwrap: str
    python: str
    cgroups: str  # "v1", "v2" or "" (none writable here: the caps are the rlimits'; docs/sandbox.md)
    notes: list[str] = field(default_factory=list)


def sandbox_python(python: str = "") -> str:
    """The interpreter model code runs on: `python`, or the one this venv was made from (its
    standard library only; ajet and the venv's packages are not in the sandbox)."""
    if python:
        return python
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base if base.exists() else Path(sys.executable).resolve())


def bwrap_path() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailableError(
            "the sandbox for model-written code needs bubblewrap, which is not installed: "
            "`apt-get install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` (Fedora); "
            "`make install` installs it where apt-get works")
    return found


def cgroups_usable() -> str:
    """"v1" or "v2" where this process may give each sandbox a pids and memory cgroup, else ""."""
    return cgroups.usable()


@functools.cache
def bwrap_options() -> frozenset[str]:
    """The options this bubblewrap knows (`--disable-userns` came in 0.8)."""
    text = subprocess.run([bwrap_path(), "--help"], capture_output=True, text=True, timeout=10,
                          env=BWRAP_ENV).stdout
    return frozenset(re.findall(r"^\s+(--[\w-]+)", text, re.MULTILINE))


# bubblewrap's own environment: nothing of the trainer's (API keys, tokens). Its reaper inside
# kept it, readable at /proc/1/environ; with --as-pid-1 there is none, and the server and the
# code get the environment of --clearenv/--setenv below.
BWRAP_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class Sandbox:
    """One sandbox: started once (`start`), then any number of calls, one at a time; `close`
    kills everything in it and forgets its files."""

    def __init__(self, limits: Limits | None = None, *, python: str = "", ro_paths: Sequence[str] = (),
                 binds: Mapping[str, str] | None = None, use_cgroups: bool | None = None) -> None:
        """`ro_paths`: host paths shown read-only at the same path (a harness's binary).
        `binds`: host directory -> path inside, writable (a directory holding the Unix socket of
        a `ModelBridge`; nothing else of the host should be bound writable)."""
        self.limits = limits or Limits()
        self.python = sandbox_python(python)
        self.ro_paths = list(ro_paths)
        self.binds = dict(binds or {})
        # "v1", "v2" or "": None asks the host; True insists (start fails without cgroups)
        self.cgroup_kind = cgroups_usable() if use_cgroups is None else (
            (cgroups_usable() or "v1") if use_cgroups else "")
        self.proc: subprocess.Popen | None = None
        # the channel to the server: requests out, answers in (extra descriptors, not
        # bubblewrap's stdin/stdout: a dumpable pid 1 that kept those open was a way in)
        self._to: Any = None
        self._from: Any = None
        self._cgroup: cgroups.Cgroup | None = None
        self._lock = threading.Lock()
        self.name = f"ajet-sb-{os.getpid()}-{next(_ids)}"

    # ------------------------------------------------------------------ lifecycle
    def argv(self, seccomp_fd: int | None = None, channel: tuple[int, int] = (0, 1)) -> list[str]:
        """bubblewrap's command line; `seccomp_fd`: a file descriptor it reads the filter from;
        `channel`: the descriptors the server reads requests from and writes answers to."""
        # --as-pid-1 (it needs --unshare-pid, in --unshare-all): the server is the namespace's
        # init, so no bubblewrap reaper runs inside as the code's uid (inside.py reaps instead);
        # --die-with-parent still kills it when bubblewrap dies (tested)
        argv = [bwrap_path(), "--unshare-all", "--unshare-user", "--as-pid-1", "--die-with-parent",
                "--new-session", "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox"]
        if "--disable-userns" in bwrap_options():  # bubblewrap >= 0.8; else the seccomp filter's
            argv.append("--disable-userns")        # refusal of CLONE_NEWUSER alone stops them
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/lib", "/lib32", "/lib64", "/sbin"):
            path = Path(top)
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), top]
            elif path.is_dir():
                argv += ["--ro-bind", top, top]
        prefix = str(Path(self.python).resolve().parent.parent)
        if not prefix.startswith("/usr/"):
            argv += ["--ro-bind", prefix, prefix]
        disk = str(self.limits.disk_mb << 20)
        argv += ["--ro-bind", str(INSIDE), INSIDE_AT, "--ro-bind", str(RELAY), RELAY_AT,
                 "--proc", "/proc", "--dev", "/dev", "--size", disk, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
                 "--size", disk, "--tmpfs", "/sandbox", "--size", disk, "--tmpfs", "/tmp"]
        for shown in self.ro_paths:  # after the tmpfs mounts: a path under /tmp stays visible
            if not shown.startswith("/usr/"):
                argv += ["--ro-bind", shown, shown]
        for host, at in self.binds.items():
            argv += ["--bind", host, at]
        argv += ["--remount-ro", "/", "--chdir", "/sandbox", "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/sandbox",
                 "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                 "--setenv", "PYTHONUNBUFFERED", "1",
                 self.python, "-I", INSIDE_AT, str(channel[0]), str(channel[1])]
        return argv

    def start(self, timeout_s: float = 20.0) -> Sandbox:
        try:
            program = seccomp.filter_program()
        except ValueError as exc:
            raise SandboxUnavailableError(f"the sandbox cannot start: {exc}") from exc
        if self.cgroup_kind:
            self._cgroup = cgroups.create(self.cgroup_kind, self.name, self.limits.memory_mb * 2 << 20,
                                          self.limits.processes + 4)
        filter_r, filter_w = os.pipe()  # a few hundred bytes: the pipe's buffer holds them
        # Extra descriptors reach the server (pid 1), which moves them low and closes the rest
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        self._to, self._from = open(requests_w, "wb"), open(answers_r, "rb")
        try:
            with open(filter_w, "wb") as fh:
                fh.write(program)
            argv = self.argv(seccomp_fd=filter_r, channel=(requests_r, answers_w))
            if self._cgroup is not None:
                argv = self._cgroup.wrap(argv)
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, start_new_session=True, env=BWRAP_ENV,
                                         pass_fds=(filter_r, requests_r, answers_w))
        except OSError as exc:
            self.close()
            raise SandboxUnavailableError(f"cannot start bubblewrap ({bwrap_path()}): {exc}") from exc
        finally:
            for fd in (filter_r, requests_r, answers_w):
                os.close(fd)
        hello = self._read_frame(timeout_s)
        if hello is None or not hello.get("ready"):
            err = self._stderr_tail()
            self.close()
            raise SandboxUnavailableError(unavailable_message(err))
        return self

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        for stream in (self._to, self._from):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a request still buffered for a dead server
                    pass
        self._to = self._from = None
        self._drop_cgroup()

    def _drop_cgroup(self) -> None:
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

    def __enter__(self) -> Sandbox:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------------ calls
    def run_python(self, code: str, *, stdin: str = "") -> RunResult:
        """Run `code` as a Python script (`main.py` in /sandbox) in a child forked from the warm
        server: no interpreter start."""
        return self._run({"op": "run", "code": code, "stdin": stdin})

    def run(self, command: str | Sequence[str], *, stdin: str = "") -> RunResult:
        """Run a program (`argv`) or a shell command line (`str`, through /bin/sh -c)."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        return self._run({"op": "run", "argv": argv, "stdin": stdin})

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Put files under /sandbox (paths relative to it)."""
        encoded = {path: base64.b64encode(data.encode() if isinstance(data, str) else data).decode()
                   for path, data in files.items()}
        self._request({"op": "write", "files": encoded}, 30.0)

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        answer = self._request({"op": "read", "path": path, "max_bytes": max_bytes}, 30.0)
        return base64.b64decode(answer["data"])

    def _run(self, request: dict[str, Any]) -> RunResult:
        request["limits"] = asdict(self.limits)
        oom_before = self._cgroup.oom_kills() if self._cgroup else 0
        try:
            raw = self._request(request, self.limits.wall_s + 10.0)
        except SandboxCrashed as exc:
            self.close()
            return RunResult(status="crashed", exit_code=None, stdout="", stderr="", detail=str(exc))
        result = classify(raw, self.limits)
        if self._cgroup and result.status in ("error", "crashed") and self._cgroup.oom_kills() > oom_before:
            result.status, result.detail = "oom", f"{self.limits.memory_mb * 2} MB for the sandbox"
        return result

    def _request(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and read its answer, which must echo the request's fresh nonce: an
        answer without it was not written by the server for this request (the code forged or
        replayed one), so the sandbox is killed and the call is `SandboxCrashed`, never read
        off by one."""
        nonce = secrets.token_hex(16)
        with self._lock:
            if not self.alive:
                raise SandboxCrashed("the sandbox is not running")
            data = json.dumps({**request, "nonce": nonce}).encode()
            try:
                self._to.write(struct.pack(">I", len(data)) + data)
                self._to.flush()
            except (BrokenPipeError, OSError) as exc:
                raise SandboxCrashed(f"the sandbox closed its input: {exc}") from exc
            answer = self._read_frame(timeout_s)
            if answer is not None and answer.get("nonce") != nonce:
                self._kill()
                raise SandboxCrashed("an answer without this request's nonce (forged from inside the sandbox); "
                                     "the sandbox was killed")
        if answer is None:
            raise SandboxCrashed("the sandbox stopped answering" + (f": {tail}" if (tail := self._stderr_tail())
                                                                     else ""))
        if "error" in answer:
            raise SandboxRequestError(answer["error"])
        return answer

    def _read_frame(self, timeout_s: float) -> dict[str, Any] | None:
        """One answer, or None when the server died or did not answer within `timeout_s`
        (then the sandbox is killed)."""
        assert self.proc is not None and self._from is not None
        answers = self._from
        box: list[Any] = []

        def read() -> None:
            try:
                head = answers.read(4)
                if len(head) == 4:
                    body = answers.read(struct.unpack(">I", head)[0])
                    box.append(json.loads(body))
            except (OSError, ValueError):
                pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive():
            self._kill()
            reader.join(5)
        return box[0] if box and isinstance(box[0], dict) else None

    def _kill(self) -> None:
        """SIGKILL bubblewrap and everything in the sandbox (`close` also reaps and cleans up)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def _stderr_tail(self) -> str:
        proc = self.proc
        if proc is None or proc.stderr is None or proc.poll() is None:
            return ""
        try:
            return proc.stderr.read().decode(errors="replace")[-2000:].strip()
        except (OSError, ValueError):
            return ""


class SandboxCrashed(Exception):  # noqa: N818 - a state, handled inside this module
    """The server inside died or stopped answering (killed from outside, or a forged answer)."""


class SandboxRequestError(Exception):
    """The server refused a request (a path outside /sandbox, an unknown op)."""


def unavailable_message(stderr: str) -> str:
    """Why bubblewrap could not start, and the fix."""
    text = stderr or "bubblewrap exited without a message"
    if re.search(r"No permissions to creat|setting up uid map|Operation not permitted|user namespace", text):
        return (f"the sandbox cannot start: bubblewrap could not create its namespaces ({text}). "
                "User namespaces are off here: enable them (`sysctl -w kernel.unprivileged_userns_clone=1`, "
                "or on Ubuntu 24.04+ `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`), or, in "
                "Docker, run the container with `--security-opt seccomp=unconfined --security-opt "
                "apparmor=unconfined`; or run the sandbox elsewhere as a service "
                "(sandbox.backend: service, docs/sandbox.md)")
    return f"the sandbox cannot start: {text}"


def probe(limits: Limits | None = None, python: str = "") -> Isolation:
    """Start a sandbox and run a trivial call; what this host gives, or
    `SandboxUnavailableError` naming the cause and the fix."""
    bwrap = bwrap_path()
    box = Sandbox(limits, python=python)
    with box:
        result = box.run_python("print(6 * 7)")
    if result.stdout.strip() != "42":
        raise SandboxUnavailableError(f"the sandbox started but a trivial call failed: {result.as_tool_text()}")
    notes = [] if box.cgroup_kind else [
        "no writable cgroup (v1, or a delegated v2 subtree): the memory cap is per process (rlimits, "
        "the seccomp filter's refusal of memfds and SysV shared memory, the capped tmpfs mounts) and "
        "the process cap is the server's count, not a cgroup's"]
    return Isolation(bwrap=bwrap, python=box.python, cgroups=box.cgroup_kind, notes=notes)
