"""The sandbox for model-written code (ajet.sandbox): each escape is refused and counted, never
a crash, and the sandbox keeps serving calls. Needs bubblewrap (`make sandbox`, which
`make test` runs): without it these tests fail, they do not skip."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest

from ajet.sandbox import Limits, Sandbox
from ajet.sandbox.box import classify, unavailable_message
from ajet.sandbox.pool import SandboxPool

LIMITS = Limits(wall_s=3.0, cpu_s=2.0, memory_mb=256, processes=16, output_bytes=8192, disk_mb=8)


@pytest.fixture(scope="module", params=[True, False], ids=["cgroups", "rlimits-only"])
def box(request):
    """One sandbox for the module, with the host's cgroups and without them (the caps must hold
    both ways: a container may not let us create cgroups)."""
    from ajet.sandbox.box import cgroups_usable

    if request.param and not cgroups_usable():
        pytest.skip("this host gives no writable cgroup v1; the rlimits-only case covers it")
    sandbox = Sandbox(LIMITS, use_cgroups=request.param).start()
    yield sandbox
    sandbox.close()


def fresh(box: Sandbox) -> Sandbox:
    """The module's sandbox, restarted if a test killed it."""
    if not box.alive:
        box.close()
        box.start()
    return box


OTHERS = ("import os\nprint([p for p in os.listdir('/proc') if p.isdigit() and int(p) not in "
          "(1, os.getpid(), os.getppid())])")  # besides the server (pid 1, this call's parent) and this call


def still_serves(box: Sandbox) -> None:
    result = fresh(box).run_python("print(6 * 7)")
    assert (result.status, result.stdout) == ("ok", "42\n")


def test_a_call_runs_and_keeps_its_files(box: Sandbox) -> None:
    box = fresh(box)
    box.write_files({"data/nums.txt": "1 2 3\n"})
    result = box.run_python("import sys\nnums = open('data/nums.txt').read().split()\n"
                            "open('out.txt', 'w').write(str(sum(map(int, nums))))\nprint(sys.argv[0])")
    assert result.status == "ok", result
    assert result.stdout == "main.py\n"
    assert box.read_file("out.txt") == b"6"
    shell = box.run("cat out.txt; echo; id -u; pwd")
    assert shell.status == "ok"
    assert shell.stdout.split() == ["6", "65534", "/sandbox"]


def test_the_models_own_error_is_an_error_not_a_refusal(box: Sandbox) -> None:
    result = fresh(box).run_python("print('before')\n1 / 0")
    assert result.status == "error"
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.stderr
    assert "before" in result.as_tool_text() and "exit code 1" in result.as_tool_text()


@pytest.mark.parametrize("path", ["/etc/shadow", "/etc/passwd", str(Path.home() / ".bashrc"),
                                  str(Path(__file__).resolve())])
def test_reading_host_files_is_refused(box: Sandbox, path: str) -> None:
    result = fresh(box).run_python(f"print(open({path!r}).read())")
    if path.startswith("/tmp/"):  # a checkout under /tmp: the sandbox's own empty /tmp hides it,
        # and a missing file there is the program's own error, as for any path under /tmp
        assert result.status == "error" and "FileNotFoundError" in result.stderr, result
    else:
        assert result.status == "refused", result
    assert result.stdout == ""
    still_serves(box)


@pytest.mark.parametrize("command", ["cat /etc/shadow", "ls /root/.ssh", "head -1 /home/*/.bashrc"])
def test_a_shell_reading_host_files_is_refused(box: Sandbox, command: str) -> None:
    result = fresh(box).run(command)
    assert result.status == "refused", result
    assert result.stdout == ""


def test_a_shell_missing_its_own_file_is_an_error(box: Sandbox) -> None:
    result = fresh(box).run("cat notes.txt; ls /sandbox/missing /tmp/missing")
    assert result.status == "error", result


@pytest.mark.parametrize("path", ["/x", "/usr/lib/x", "/root/x", "/proc/x"])
def test_writing_outside_the_work_dir_is_refused(box: Sandbox, path: str) -> None:
    result = fresh(box).run_python(f"open({path!r}, 'w').write('x')")
    assert result.status == "refused", result
    assert not Path(path).exists() or path == "/proc/x"


def test_the_disk_is_capped(box: Sandbox) -> None:
    result = fresh(box).run_python("open('big', 'wb').write(b'x' * (64 << 20))")
    assert result.status in ("error", "refused"), result
    assert "File too large" in result.stderr or "No space left" in result.stderr


def test_network_connects_are_refused(box: Sandbox) -> None:
    with socket.socket() as server:  # a port on the host's loopback: not the sandbox's
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        for target in (f"('127.0.0.1', {port})", "('1.1.1.1', 80)", "('pypi.org', 443)"):
            result = fresh(box).run_python(f"import socket\nsocket.create_connection({target}, timeout=2)")
            assert result.status == "refused", (target, result)


def test_a_fork_bomb_is_refused_and_cleaned_up(box: Sandbox) -> None:
    started = time.monotonic()
    result = fresh(box).run_python("import os\nwhile True:\n    try:\n        os.fork()\n"
                                   "    except OSError:\n        pass")
    assert result.status == "refused", result
    assert "processes" in result.detail
    assert time.monotonic() - started < LIMITS.wall_s + 2
    assert box.run_python(OTHERS).stdout == "[]\n"


def test_an_endless_loop_times_out(box: Sandbox) -> None:
    result = fresh(box).run_python("while True:\n    pass")
    assert result.status == "timeout", result
    assert result.cpu_s < LIMITS.cpu_s + 1.5
    sleeper = box.run_python("import time\ntime.sleep(60)")  # no CPU: the wall clock stops it
    assert sleeper.status == "timeout" and sleeper.wall_s < LIMITS.wall_s + 1
    still_serves(box)


def test_ten_gigabytes_of_output_are_cut(box: Sandbox) -> None:
    started = time.monotonic()
    result = fresh(box).run_python("import sys\nfor _ in range(10 * 1024 * 16):\n"
                                   "    sys.stdout.write('x' * 65536)")
    assert result.status == "output_limit", result
    assert len(result.stdout) + len(result.stderr) <= LIMITS.output_bytes
    assert time.monotonic() - started < 3
    assert len(result.as_tool_text()) <= 2100
    still_serves(box)


@pytest.mark.parametrize("code", ["a = bytearray(10 ** 10)",
                                  "a = []\nwhile True:\n    a.append(bytearray(10 ** 7))"])
def test_memory_exhaustion_is_oom(box: Sandbox, code: str) -> None:
    result = fresh(box).run_python(code)
    assert result.status == "oom", result
    still_serves(box)


def test_a_process_that_outlives_its_call_is_killed(box: Sandbox) -> None:
    result = fresh(box).run_python(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(120)\n    os._exit(0)\nprint('parent done')")
    assert result.status == "ok" and result.stdout == "parent done\n"
    assert result.leftover >= 1
    assert box.run_python(OTHERS).stdout == "[]\n"


def test_orphans_are_reaped_and_the_call_keeps_its_own_exit_status(box: Sandbox) -> None:
    """The server is the namespace's pid 1, so every orphan is its child: it reaps them while the
    call runs (40 zombies would pass the cap of 16 processes) without taking the wait status
    of the call's own child."""
    result = fresh(box).run_python(
        "import os, sys, time\nfor _ in range(40):\n    if os.fork() == 0:\n        if os.fork() == 0:\n"
        "            os._exit(0)\n        os._exit(0)\n    os.wait()\n    time.sleep(0.002)\nsys.exit(3)")
    assert (result.status, result.exit_code, result.detail) == ("error", 3, ""), result
    assert result.leftover == 0
    assert box.run_python(OTHERS).stdout == "[]\n"


KILL_THE_SERVER = """
import os, signal
print(os.getppid(), open('/proc/1/cmdline').read().split('\\0')[2],
      [line.split()[1] for line in open('/proc/1/status') if line.startswith('SigCgt')])
for sig in range(1, signal.SIGRTMAX + 1):
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        os.kill(1, sig)
os.kill(1, signal.SIGSTOP)
os.kill(1, signal.SIGKILL)
print('sent')
"""


def test_code_cannot_kill_its_server_and_the_session_goes_on() -> None:
    """The server is pid 1 of the sandbox (bubblewrap's --as-pid-1) and keeps no signal
    handler, so the kernel drops every signal the code sends it, SIGKILL and SIGSTOP too."""
    with SandboxPool(size=1, limits=LIMITS) as pool, pool.session_sync({"a.txt": "x"}) as session:
        signals = session.run_python(KILL_THE_SERVER)
        assert (signals.status, signals.stdout) == ("ok", "1 /opt/ajet/inside.py ['0000000000000000']\nsent\n"), signals
        again = session.run_python("print(open('a.txt').read())")
        assert (again.status, again.stdout) == ("ok", "x\n")  # the same sandbox, its files kept
        metrics = session.metrics()
    assert metrics["sandbox/crashed"] == 0.0
    assert metrics["sandbox/calls"] == 2.0


def _gone_or_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_sandbox_killed_from_outside_is_a_crashed_call_and_the_session_recovers() -> None:
    """bubblewrap SIGKILLed on the host: its server inside dies with it (--die-with-parent holds
    with --as-pid-1), the call reports crashed and the next one gets a fresh sandbox."""
    import psutil

    with SandboxPool(size=1, limits=LIMITS) as pool, pool.session_sync() as session:
        assert session.run_python("open('a.txt', 'w').write('x')").ok
        bwrap = session.box.proc
        [server] = psutil.Process(bwrap.pid).children()
        bwrap.kill()
        bwrap.wait(timeout=10)
        deadline = time.monotonic() + 5  # dead while its pipes to the host are still open
        while not _gone_or_zombie(server.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _gone_or_zombie(server.pid), server
        killed = session.run_python("print(open('a.txt').read())")
        assert killed.status == "crashed", killed
        again = session.run_python("import os\nprint('fresh', os.path.exists('a.txt'))")
        assert again.stdout == "fresh False\n"
        metrics = session.metrics()
    assert metrics["sandbox/crashed"] == 1.0
    assert metrics["sandbox/calls"] == 3.0


def test_the_session_counts_each_kind_for_the_metrics() -> None:
    async def episode() -> dict[str, float]:
        with SandboxPool(size=1, limits=LIMITS) as pool:
            async with pool.session() as session:
                for code in ["print(1)", "while True: pass", "a = bytearray(10 ** 10)",
                             "open('/etc/shadow')", "import sys\nwhile True: sys.stdout.write('x' * 9000)"]:
                    await session.arun_python(code)
                return session.metrics()

    metrics = asyncio.run(episode())
    assert metrics["sandbox/calls"] == 5
    assert (metrics["sandbox/timeouts"], metrics["sandbox/oom"], metrics["sandbox/refused"],
            metrics["sandbox/output_limit"]) == (1, 1, 1, 1)
    assert metrics["sandbox/call_ms"] > 0


def test_episodes_never_share_a_sandbox() -> None:
    with SandboxPool(size=2, limits=LIMITS) as pool:
        with pool.session_sync() as first:
            first.run_python("open('/sandbox/secret', 'w').write('mine')\n"
                             "open('/tmp/secret', 'w').write('mine')")
        with pool.session_sync() as second:
            result = second.run("ls /sandbox /tmp")
        assert result.status == "ok" and "secret" not in result.stdout


def test_the_pool_hands_out_warm_sandboxes_concurrently() -> None:
    with SandboxPool(size=2, limits=LIMITS) as pool:
        time.sleep(1.0)
        outputs: list[str] = []

        def one(i: int) -> None:
            with pool.session_sync() as session:
                outputs.append(session.run_python(f"print({i} * 2)").stdout.strip())

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outputs, key=int) == [str(2 * i) for i in range(6)]
        assert pool.started >= 6


def test_classify_reads_the_servers_verdicts() -> None:
    base = {"stdout": "", "stderr": "", "exit_code": 0, "signal": None, "verdict": "", "wall_s": 0.1,
            "cpu_s": 0.1, "output_bytes": 0, "leftover": 0}
    assert classify(base, LIMITS).status == "ok"
    assert classify({**base, "exit_code": None, "signal": 24, "cpu_s": 2.0}, LIMITS).status == "timeout"
    assert classify({**base, "exit_code": 1, "stderr": "PermissionError: [Errno 13] Permission denied"},
                    LIMITS).status == "refused"
    assert classify({**base, "exit_code": 1, "stderr": "FileNotFoundError: No such file or directory: "
                                                       "'/sandbox/x.txt'"}, LIMITS).status == "error"
    assert classify({**base, "exit_code": 1, "stderr": "ValueError: bad"}, LIMITS).status == "error"


def test_a_host_without_user_namespaces_gets_the_fix() -> None:
    message = unavailable_message("bwrap: No permissions to creating new namespace, likely because the "
                                  "kernel does not allow non-privileged user namespaces")
    assert "kernel.unprivileged_userns_clone" in message and "sandbox.backend: service" in message


def test_with_cgroups_every_process_of_the_sandbox_is_inside_them() -> None:
    """bubblewrap and the server (its only child: --as-pid-1, no reaper) are born in the
    sandbox's pids and memory groups (a pid added after the start missed the processes
    bubblewrap had already forked)."""
    import psutil

    from ajet.sandbox.box import cgroups_usable

    if not cgroups_usable():
        pytest.skip("this host gives no writable cgroup v1")
    with Sandbox(LIMITS, use_cgroups=True) as box:
        assert box.run_python("print(1)").ok
        tree = [psutil.Process(box.proc.pid), *psutil.Process(box.proc.pid).children(recursive=True)]
        assert [proc.cmdline()[-3] for proc in tree] == ["/opt/ajet/inside.py"] * 2  # bwrap, the server
        for proc in tree:
            groups = Path(f"/proc/{proc.pid}/cgroup").read_text().splitlines()
            for controller in ("pids", "memory"):
                line = next(g for g in groups if controller in g.split(":")[1].split(","))
                assert line.endswith(box.name), (proc.cmdline()[:2], line)
