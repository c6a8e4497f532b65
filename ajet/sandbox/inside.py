"""The fork server that runs inside one sandbox (stdlib only: it runs on the bare interpreter
that the sandbox binds read-only, without ajet installed).

The host (`ajet.sandbox.box.Sandbox`) starts it once per sandbox under bubblewrap, as the PID
namespace's pid 1 (`--as-pid-1`), and sends requests as frames (4-byte big-endian length +
JSON) on a pipe whose descriptor is the first argument; answers go back on the second (extra
descriptors, not stdin/stdout, which are /dev/null). A warm server makes a call cost a fork,
not an interpreter start:

    {"op": "run", "code": "...", "stdin": "", "limits": {...}}   python code, in a forked child
    {"op": "run", "argv": ["sh", "-c", "..."], ...}              a program, forked and exec'd
    {"op": "write", "files": {"path": "<base64>"}}                 into /sandbox
    {"op": "read", "path": "...", "max_bytes": N}

Every request carries a fresh random "nonce" that its answer echoes: the host drops a sandbox
whose answer lacks it. The server makes itself non-dumpable first, so the code it runs (same
uid) can neither open /proc/1/fd/* (the pipe to the host), /proc/1/mem or /proc/1/environ,
nor ptrace it; and it keeps no signal handler, so the kernel drops every signal the code sends
its pid 1 (SIGKILL included). The nonce is taken out of the request before a call's child is
forked.

`write` and `read` touch regular files under /sandbox only: no component may be a symbolic
link (each is opened with O_NOFOLLOW, relative to its parent), and a FIFO, socket or device
is refused without being waited on (O_NONBLOCK, then fstat).

Each call's child gets its own session and rlimits (CPU seconds, address space, file size,
open files). While it runs the server enforces the wall clock, the output cap and the process
cap (it counts the processes in the sandbox's PID namespace). As pid 1 it is the parent of
every orphan, so it reaps them all as it goes (an unreaped zombie would count against the cap),
keeping the wait status of the call's own child. When the call ends, every process in the
namespace except this server is SIGKILLed (`kill(-1)` spares the caller) and reaped, so nothing
the call started outlives it.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import fcntl
import io
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import time
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the annotations are never evaluated: any interpreter the sandbox has runs this
    from typing import Any, NoReturn

    Message = dict[str, Any]  # a request or an answer: one JSON object

WORK = "/sandbox"
PR_SET_DUMPABLE = 4


def not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/fd, mem, environ and ptrace refused to the code."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def send(fd: int, obj: Message) -> None:
    data = json.dumps(obj).encode()
    os.write(fd, struct.pack(">I", len(data)) + data)


def read_exact(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd: int) -> Message | None:
    head = read_exact(fd, 4)
    if head is None:
        return None
    body = read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def other_pids(me: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, me):
            pids.append(int(name))
    return pids


def kill_all(me: int, call: int) -> tuple[int, int | None]:
    """SIGKILL every process of the namespace but this server (its pid 1); the number that were
    alive, and the wait status of the call's child `call` if it was reaped here (else None). A
    fork loop can add processes while the kill runs, so repeat."""
    first = len(other_pids(me))
    status = None
    for _ in range(200):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        status = reap(call, status)
        if not other_pids(me):
            break
        time.sleep(0.002)
    return first, status


def reap(call: int | None, status: int | None = None) -> int | None:
    """Wait for every child that has exited: as the namespace's pid 1, the server is the parent
    of every orphan the code leaves, and an unreaped zombie would count against the process cap
    and outlive the call. The wait status of `call` if it is among them, else `status`."""
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == call:
            status = raw


def set_limits(limits: Message) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if limits.get("address_space", True):
        memory = int(limits["memory_mb"]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    disk = int(limits["disk_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    processes = int(limits["processes"])
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def child(req: Message, out_w: int, err_w: int, in_r: int) -> NoReturn:
    """In the forked child: never returns."""
    code = 1
    try:
        os.setsid()
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 4096)  # the server holds a few low descriptors: the pipes to the host among them
        os.chdir(WORK)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the server's is SIG_DFL (main)
        set_limits(req["limits"])
        if "argv" in req:
            os.execvpe(req["argv"][0], req["argv"], dict(os.environ))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=False)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        sys.argv = ["main.py"]
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        try:
            exec(compile(req["code"], "main.py", "exec"), namespace)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the model's code; its traceback is the result
            traceback.print_exc()
            code = 1
    except BaseException:  # noqa: BLE001 - exec failed (no such program, a limit)
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
        code = 127 if "argv" in req else 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - a closed pipe, a full disk
                pass
        os._exit(code)


def run(req: Message, me: int) -> Message:
    """One call: its child forked, watched until it ends or breaks a cap, then every process of
    the namespace but this server killed."""
    limits = req["limits"]
    pid, out_r, err_r, started = fork_call(req)
    output = Output(out_r, err_r, int(limits["output_bytes"]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    verdict, status = watch(pid, me, output, limits, started)
    wall = time.monotonic() - started
    survivors, status = end_call(pid, me, status)
    for fd in (out_r, err_r):
        os.close(fd)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    exit_code, signal_no = exit_code_and_signal(status)
    return {
        "stdout": output.text(out_r),
        "stderr": output.text(err_r),
        "exit_code": exit_code,
        "signal": signal_no,
        "verdict": verdict,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime,
        "output_bytes": output.total,
        "leftover": survivors,
    }


def fork_call(req: Message) -> tuple[int, int, int, float]:
    """Fork the call's child (which never comes back from `child`) on three new pipes and write
    its stdin (64 KiB at most, without blocking); (its pid, the read ends of its stdout and
    stderr, when it was forked)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(req, out_w, err_w, in_r)
    os.close(out_w)
    os.close(err_w)
    os.close(in_r)
    stdin = req.get("stdin", "").encode()
    if stdin:
        try:
            os.set_blocking(in_w, False)
            os.write(in_w, stdin[:65536])
        except OSError:
            pass
    os.close(in_w)
    return pid, out_r, err_r, started


class Output:
    """A call's stdout and stderr as read from their pipes: kept up to the cap in all, counted
    beyond it (`total`)."""

    def __init__(self, out_r: int, err_r: int, cap: int) -> None:
        self.chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        self.total = 0
        self.cap = cap

    def add(self, fd: int, data: bytes) -> bool:
        """Keep what fits under the cap; True when the call has now written more than the cap."""
        room = self.cap - self.total
        self.chunks[fd].append(data[:max(0, room)])
        self.total += len(data)
        return self.total > self.cap

    def text(self, fd: int) -> str:
        return b"".join(self.chunks[fd]).decode("utf-8", "replace")


def watch(pid: int, me: int, output: Output, limits: Message, started: float) -> tuple[str, int | None]:
    """Read the call's output and reap as it runs, until its child has exited and its pipes are
    closed (or 50 ms after the exit: a background process may hold them open) or a cap is broken:
    the wall clock, the process count (every 5 ms) or the output. (The verdict, "" when no cap
    was broken; the child's wait status, None when it has not exited.)"""
    deadline = started + float(limits["wall_s"])
    status = None
    open_fds = list(output.chunks)  # the read ends of stdout and stderr, until each is at its end
    next_count = 0.0
    exited_at = None
    while open_fds or status is None:
        now = time.monotonic()
        if exited_at is not None and now - exited_at > 0.05:
            break  # the call is over; a background process still holds its output open
        if now > deadline:
            return "timeout", status
        if now >= next_count:
            next_count = now + 0.005
            if len(other_pids(me)) > int(limits["processes"]):
                return "process_limit", status
        if open_fds and read_ready(open_fds, output):
            return "output_limit", status
        if status is None:
            status = reap(pid)
            if status is not None:
                exited_at = time.monotonic()
            elif not open_fds:
                time.sleep(0.002)
        else:
            reap(None)  # orphans the call left behind
    return "", status


def read_ready(open_fds: list[int], output: Output) -> bool:
    """Read the pipes of `open_fds` that hold data (waiting 5 ms at most); a pipe at its end
    leaves `open_fds`. True when the call has written more than the output cap."""
    over = False
    ready, _, _ = select.select(open_fds, [], [], 0.005)
    for fd in ready:
        data = os.read(fd, 65536)
        if not data:
            open_fds.remove(fd)
            continue
        if output.add(fd, data):
            over = True
    return over


def end_call(pid: int, me: int, status: int | None) -> tuple[int, int | None]:
    """Kill the call's child if it has not exited, then every other process of the namespace
    but this server, and reap them; (how many were alive, the child's wait status)."""
    if status is None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    survivors, reaped = kill_all(me, pid)
    if status is None:
        status = reaped
    if status is None:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = None
    return survivors, status


def exit_code_and_signal(status: int | None) -> tuple[int | None, int | None]:
    """(The exit code, the signal that ended it) of a wait status; None for what it does not say."""
    if status is not None:
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status), None
        if os.WIFSIGNALED(status):
            return None, os.WTERMSIG(status)
    return None, None


def inside(path: str) -> list[str]:
    """`path` (relative to /sandbox) as its components, or ValueError if it leaves /sandbox."""
    full = os.path.normpath(os.path.join(WORK, path))
    if full != WORK and not full.startswith(WORK + "/"):
        raise ValueError(f"path outside /sandbox: {path!r}")
    parts = full[len(WORK):].strip("/").split("/")
    if parts == [""]:
        raise ValueError(f"not a file: {path!r}")
    return parts


def open_regular(path: str, flags: int, create_dirs: bool = False) -> int:
    """A descriptor of the regular file `path` under /sandbox, each component opened without
    following a link; a link, FIFO, socket or device is refused (ValueError) without blocking."""
    parts = inside(path)
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY | nofollow)
    try:
        for part in parts[:-1]:
            if create_dirs:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ValueError(f"refused: {path!r}: {part!r} is a link or not a directory") from None
                raise
            os.close(fd)
            fd = sub
        try:
            target = os.open(parts[-1], flags | nofollow | os.O_NONBLOCK, 0o644, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise ValueError(f"refused: {path!r} is a link or not a regular file") from None
            raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(target).st_mode):
        os.close(target)
        raise ValueError(f"refused: {path!r} is not a regular file")
    return target


def write(req: Message) -> Message:
    for path, data in req["files"].items():
        fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, create_dirs=True)
        with open(fd, "wb") as fh:
            fh.write(base64.b64decode(data))
    return {"written": len(req["files"])}


def read(req: Message) -> Message:
    limit = int(req.get("max_bytes", 1 << 20))
    with open(open_regular(req["path"], os.O_RDONLY), "rb") as fh:
        data = fh.read(limit + 1)
    return {"data": base64.b64encode(data[:limit]).decode(), "truncated": len(data) > limit}


def low_fd(fd: int) -> int:
    """`fd` moved to the lowest free descriptor above 2, close-on-exec (the host's numbers may
    be high; a call's child closes 3..4095)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    if fd > 2:
        os.close(fd)
    return new


def main() -> None:
    not_dumpable()
    # The server is the namespace's pid 1 (bubblewrap's --as-pid-1): the kernel drops a signal
    # sent to it from inside unless it has a handler, so it keeps none. Python's SIGINT handler
    # would let the code end the server with KeyboardInterrupt (SIGPIPE and SIGXFSZ stay ignored).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    cin, cout = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (0, 1)
    cin, cout = low_fd(cin), low_fd(cout)
    for name in os.listdir("/proc/self/fd"):  # nothing else of the host's (a call's child closes < 4096)
        if int(name) > 2 and int(name) not in (cin, cout):
            try:
                os.close(int(name))
            except OSError:
                pass
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    me = os.getpid()
    send(cout, {"ready": True, "pid": me, "uid": os.getuid()})
    while True:
        req = recv(cin)
        if req is None:
            return
        nonce = req.pop("nonce", None)
        try:
            if req["op"] == "run":
                answer = run(req, me)
            elif req["op"] == "write":
                answer = write(req)
            elif req["op"] == "read":
                answer = read(req)
            else:
                answer = {"error": "unknown op {!r}".format(req["op"])}
        except Exception as exc:  # noqa: BLE001 - answered, the server lives on
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answer["nonce"] = nonce
        send(cout, answer)


if __name__ == "__main__":
    main()
