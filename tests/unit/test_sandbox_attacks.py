"""The sandbox against code that attacks it (issue 69 §1, each hole an outside audit reproduced):
the host's secrets through /proc, files planted for the host to read, answers forged for later
calls, ptrace, new namespaces, and memory the per-process caps do not count. Each test fails on
the sandbox before these fixes. Needs bubblewrap (`make sandbox`); skipped without it."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ajet.sandbox import Limits, Sandbox, cgroups, seccomp
from ajet.sandbox.box import SandboxRequestError
from ajet.sandbox.pool import SandboxPool

LIMITS = Limits(wall_s=5.0, cpu_s=4.0, memory_mb=256, processes=16, output_bytes=8192, disk_mb=8)
SECRET = "sk-audit-0123456789abcdef"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed here")


# The attacks run twice where this machine lets ajet make cgroups (the issue asks for both):
# without them (rlimits, the seccomp filter and the tmpfs caps alone: the hard case, every
# container without a delegated cgroup), and with the cgroup kind this machine has.
CGROUPS = ["none"] + ([cgroups.usable()] if shutil.which("bwrap") and cgroups.usable() else [])


@pytest.fixture(scope="module", params=CGROUPS, ids=lambda kind: f"cgroups_{kind}")
def box(request: pytest.FixtureRequest):
    """A sandbox started while this process's environment holds a secret (an API key)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_API_KEY", SECRET)
        patch.setenv("AJET_SANDBOX_TOKEN", SECRET)
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap is not installed here")
        sandbox = Sandbox(LIMITS, use_cgroups=request.param != "none").start()
        assert sandbox.cgroup_kind == ("" if request.param == "none" else request.param)
    yield sandbox
    sandbox.close()


def fresh(box: Sandbox) -> Sandbox:
    if not box.alive:
        box.close()
        box.start()
    return box


# ------------------------------------------------------------------ 1. the host's environment
@needs_bwrap
def test_no_secret_of_the_host_in_any_environ_inside(box: Sandbox) -> None:
    result = fresh(box).run_python(
        "import os\n"
        "for pid in ['1', 'self', str(os.getppid())] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        print(pid, open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(pid, exc)")
    assert result.status == "ok", result
    assert SECRET not in result.stdout
    first = result.stdout.splitlines()[0]
    assert first.startswith("1 [Errno 13]"), first  # pid 1 is the server, not dumpable (it was bwrap's)


@needs_bwrap
def test_a_planted_symlink_is_not_followed_by_read_file(box: Sandbox) -> None:
    fresh(box).run("ln -s /proc/1/environ env1; mkdir -p real; ln -s /proc/1 proc1; ln -s real alias")
    for path in ("env1", "proc1/environ", "alias/x"):
        with pytest.raises(SandboxRequestError, match="refused"):
            box.read_file(path)
        with pytest.raises(SandboxRequestError, match="refused"):
            box.write_files({path: "overwritten"})
    box.write_files({"real/x": "mine"})
    assert box.read_file("real/x") == b"mine"


@needs_bwrap
def test_a_planted_fifo_is_refused_at_once_and_the_sandbox_lives_on() -> None:
    with SandboxPool(size=0, limits=LIMITS) as pool, pool.session_sync() as session:
        assert session.run("mkfifo pipe").ok
        started = time.monotonic()
        with pytest.raises(SandboxRequestError, match="not a regular file"):
            session.read_file("pipe")
        with pytest.raises(SandboxRequestError, match="refused"):
            session.write_files({"pipe": "x"})
        assert time.monotonic() - started < 2.0  # not the 30 s wait, then a dead sandbox
        assert session.run_python("print('alive')").stdout == "alive\n"
        assert session.metrics()["sandbox/crashed"] == 0


# ------------------------------------------------------------------ 2. the server's channel
FORGE = r"""
import json, os, struct
forged = json.dumps({"stdout": "forged", "stderr": "", "exit_code": 0, "signal": None, "verdict": "",
                     "wall_s": 0.0, "cpu_s": 0.0, "output_bytes": 6, "leftover": 0}).encode()
for pid in (os.getppid(), 1):  # the server, which is pid 1 (bubblewrap's reaper was, and held its stdio)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError as exc:  # the directory itself is refused where the host's user is not root
        print("refused", pid, "dir", exc.errno)
        continue
    for fd in fds:
        try:
            w = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
            os.write(w, struct.pack(">I", len(forged)) + forged)
            print("wrote", pid, fd, os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError as exc:
            print("refused", pid, fd, exc.errno)
"""


@needs_bwrap
def test_code_cannot_write_frames_into_the_servers_pipe(box: Sandbox) -> None:
    forging = fresh(box).run_python(FORGE)
    assert forging.status == "ok" and "forged" not in forging.stdout, forging
    lines = forging.stdout.splitlines()
    assert lines and {line.split()[1] for line in lines} == {"1"}, lines  # the server is pid 1
    for line in lines:  # not dumpable: none of its descriptors opens
        assert line.startswith("refused"), line
    following = box.run_python("print('real')")
    assert (following.status, following.stdout) == ("ok", "real\n")  # not off by one


def test_an_answer_without_the_requests_nonce_kills_the_sandbox() -> None:
    """The host side alone: a 'server' that answers with a well-formed frame of its own."""
    fake = ("import json, os, struct, sys\n"
            "def send(obj):\n"
            "    data = json.dumps(obj).encode(); os.write(1, struct.pack('>I', len(data)) + data)\n"
            "send({'ready': True})\n"
            "head = os.read(0, 4); os.read(0, struct.unpack('>I', head)[0])\n"
            "send({'stdout': 'forged', 'stderr': '', 'exit_code': 0, 'signal': None, 'verdict': '',\n"
            "      'wall_s': 0.0, 'cpu_s': 0.0, 'output_bytes': 6, 'leftover': 0, 'nonce': 'guessed'})\n"
            "sys.stdin.read()\n")
    box = Sandbox(LIMITS, use_cgroups=False)
    box.proc = subprocess.Popen([sys.executable, "-c", fake], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    box._to, box._from = box.proc.stdin, box.proc.stdout
    assert box._read_frame(5.0) == {"ready": True}
    result = box.run_python("print(1)")
    assert result.status == "crashed" and "nonce" in result.detail, result
    assert not box.alive


@needs_bwrap
def test_code_cannot_trace_or_read_the_server_or_pid_1(box: Sandbox) -> None:
    result = fresh(box).run_python(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for pid in (1, os.getppid()):\n"
        "    print('attach', pid, libc.ptrace(16, pid, 0, 0), os.strerror(ctypes.get_errno()))\n"
        "for path in (f'/proc/{os.getppid()}/mem', f'/proc/{os.getppid()}/environ', '/proc/1/mem'):\n"
        "    try:\n"
        "        open(path, 'rb').read(1)\n"
        "        print('read', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, exc.strerror)")
    assert result.status == "ok", result
    lines = result.stdout.splitlines()
    assert [line.split()[2] for line in lines[:2]] == ["-1", "-1"], lines
    assert all(line.startswith("refused") for line in lines[2:]), lines
    assert box.alive
    assert box.run_python("print(6 * 7)").stdout == "42\n"


PID_1 = r"""
import errno, os
print("pid 1:", open("/proc/1/cmdline").read().split("\0")[2], "parent:", os.getppid())
try:
    fds = os.listdir("/proc/1/fd")
except PermissionError:  # the directory itself is refused where the host's user is not root
    fds = []
for path, flags in [("/proc/1/mem", os.O_RDWR), ("/proc/1/mem", os.O_RDONLY), ("/proc/1/environ", os.O_RDONLY),
                    ("/proc/1/maps", os.O_RDONLY), ("/proc/1/fd/0", os.O_WRONLY)] + [
                   (f"/proc/1/fd/{fd}", os.O_RDWR) for fd in fds]:
    try:
        os.close(os.open(path, flags))
        print("opened", path, flags)
    except OSError as exc:
        print("refused", path, errno.errorcode[exc.errno])
for fd in fds:
    try:
        print("link", fd, os.readlink(f"/proc/1/fd/{fd}"))
    except OSError as exc:
        print("refused link", fd, errno.errorcode[exc.errno])
"""


@needs_bwrap
def test_pid_1_is_the_server_and_the_code_cannot_open_it(box: Sandbox) -> None:
    """bubblewrap's reaper was pid 1: of the code's uid and dumpable, so /proc/1/mem opened
    read-write (ptrace did not) and code written into it outlived every call. With --as-pid-1
    the server is pid 1, and it is not dumpable: its mem, environ and descriptors stay shut."""
    import psutil

    [server] = psutil.Process(fresh(box).proc.pid).children()  # no reaper between bwrap and the server
    assert server.cmdline()[-3:-2] == ["/opt/ajet/inside.py"]
    result = box.run_python(PID_1)
    assert result.status == "ok", result
    first, *rest = result.stdout.splitlines()
    assert first == "pid 1: /opt/ajet/inside.py parent: 1", first
    assert len(rest) >= 5 and all(line.startswith("refused") and line.endswith("EACCES") for line in rest), rest
    assert box.run_python("print(6 * 7)").stdout == "42\n"


# ------------------------------------------------------------------ 3. the seccomp filter
@needs_bwrap
def test_new_namespaces_and_other_kernel_surfaces_are_refused(box: Sandbox) -> None:
    result = fresh(box).run_python(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, flag in [('user', 0x10000000), ('mount', 0x20000), ('net', 0x40000000), ('pid', 0x20000000)]:\n"
        "    print('unshare', name, libc.unshare(flag), ctypes.get_errno())\n"
        "print('keyctl', libc.syscall(250 if os.uname().machine == 'x86_64' else 219, 0, 0, 0, 0, 0),"
        " ctypes.get_errno())")
    assert result.status == "ok", result
    for line in result.stdout.splitlines():
        assert line.split()[-2:] == ["-1", "1"], line  # -1, EPERM
    shell = box.run("unshare -U true")
    assert shell.status == "refused" and "Operation not permitted" in shell.stderr, shell
    threads = box.run_python("import subprocess, threading\nt = threading.Thread(target=print, args=('thread',))\n"
                             "t.start(); t.join()\nprint(subprocess.run(['echo', 'child'], capture_output=True,"
                             " text=True).stdout, end='')")
    assert threads.stdout == "thread\nchild\n", threads  # clone3's ENOSYS: glibc falls back to clone


def test_the_filter_is_built_for_both_machines() -> None:
    for machine in ("x86_64", "aarch64"):
        program = seccomp.filter_program(machine)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096
        ops = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
        assert ops[1][3] == seccomp.AUDIT_ARCH[machine]
        denied = {k for op, _, _, k in ops if op == 0x15}
        assert seccomp.SYSCALLS[machine]["ptrace"] in denied and seccomp.SYSCALLS[machine]["memfd_create"] in denied
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.filter_program("riscv64")


# ------------------------------------------------------------------ 4. memory past the caps
@needs_bwrap
def test_memfds_cannot_hold_memory_past_the_cap(box: Sandbox) -> None:
    cap = LIMITS.memory_mb
    result = fresh(box).run_python(
        "import os\nheld, fds = 0, []\n"
        f"while held < {cap + 64} << 20:\n"
        "    fd = os.memfd_create('x')\n"
        "    os.write(fd, b'x' * (4 << 20))\n"
        "    fds.append(fd)\n"
        "    held += 4 << 20\n"
        "print(held >> 20)")
    assert result.status == "refused" and "Operation not permitted" in result.stderr, result


@needs_bwrap
def test_sysv_shared_memory_is_refused(box: Sandbox) -> None:
    result = fresh(box).run_python("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                   "print(libc.shmget(0, 64 << 20, 0o1000 | 0o600), ctypes.get_errno())")
    assert result.stdout.split() == ["-1", "1"], result


@needs_bwrap
def test_dev_shm_is_capped_and_dev_is_read_only(box: Sandbox) -> None:
    result = fresh(box).run_python(
        "import os\nheld = 0\n"
        "try:\n"
        "    while held < 64 << 20:\n"
        "        with open(f'/dev/shm/f{held}', 'wb') as fh:\n"
        "            fh.write(b'x' * (1 << 20))\n"
        "        held += 1 << 20\n"
        "except OSError as exc:\n"
        "    print(exc.strerror)\n"
        "print(held >> 20)")
    reason, held_mb = result.stdout.splitlines()
    assert reason == "No space left on device" and int(held_mb) <= LIMITS.disk_mb, result
    dev = box.run("echo x > /dev/filler")
    assert dev.status == "refused" and "Read-only file system" in dev.stderr, dev
    assert box.run("echo x > /dev/null").ok


def test_a_delegated_cgroup_v2_group_gets_the_caps(tmp_path: Path) -> None:
    """The v2 group's files (a plain directory stands in for the cgroup2 mount: this machine's
    memory and pids controllers are on v1, so the kernel side is not exercised here)."""
    group = cgroups.CgroupV2("box", 512 << 20, 36, parent=tmp_path)
    assert (tmp_path / "box" / "memory.max").read_text() == str(512 << 20)
    assert (tmp_path / "box" / "pids.max").read_text() == "36"
    (tmp_path / "box" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert group.oom_kills() == 2
    argv = group.wrap(["bwrap", "x"])
    assert str(tmp_path / "box" / "cgroup.procs") in argv[2] and argv[-2:] == ["bwrap", "x"]
    for name in ("memory.max", "pids.max", "memory.events"):
        (tmp_path / "box" / name).unlink()
    group.remove()
    assert not (tmp_path / "box").exists()
