"""The sandbox as an env service (ajet.sandbox.service), the run's shared pool built from the
config (`sandbox:`), and the start-up check that names the fix when bubblewrap is missing."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from ajet.cli import train as train_cmd
from ajet.config.choices import SandboxBackend
from ajet.config.deploy import SandboxConfig
from ajet.errors import SandboxUnavailableError
from ajet.sandbox import shared
from ajet.sandbox.box import Limits
from ajet.sandbox.pool import SandboxPool
from ajet.sandbox.service import RemoteSandbox, create_app
from ajet.sandbox.service import main as service_main
from ajet.task_reader.env_server import serve_in_thread

LIMITS = Limits(wall_s=3.0, cpu_s=2.0, memory_mb=256, processes=16, output_bytes=4096, disk_mb=8)
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def service():
    with SandboxPool(size=1, limits=LIMITS) as pool, serve_in_thread(create_app(pool, TOKEN)) as url:
        yield url


def test_remote_sandbox_runs_code_and_keeps_files(service: str) -> None:
    box = RemoteSandbox(service, TOKEN).start()
    try:
        box.write_files({"in.txt": "21"})
        result = box.run_python("print(int(open('in.txt').read()) * 2)")
        assert (result.status, result.stdout) == ("ok", "42\n")
        assert box.run("echo hi > out.txt && cat out.txt").stdout == "hi\n"
        assert box.read_file("out.txt") == b"hi\n"
        assert box.run_python("while True: pass").status == "timeout"
        assert box.run_python("open('/etc/shadow')").status == "refused"
    finally:
        box.close()


def test_the_service_needs_its_token_before_reading_a_body(service: str) -> None:
    with pytest.raises(SandboxUnavailableError, match="401"):
        RemoteSandbox(service, "wrong").start()
    with httpx.Client(base_url=service) as client:
        assert client.get("/health").status_code == 200
    # a 20 MiB body declared: answered 413 from the headers alone (a client that sent the
    # body would race the server's early answer and close, so only the headers go out)
    host, port = service.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /create HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {20 << 20}\r\n\r\n".encode())
        assert sock.recv(4096).split(b"\r\n", 1)[0].endswith(b"413 Request Entity Too Large")
    with httpx.Client(base_url=service) as client:
        assert client.get("/docs").status_code == 401  # no docs route, and no token: refused first


def test_instances_are_unguessable_and_released(service: str) -> None:
    box = RemoteSandbox(service, TOKEN).start()
    instance = box.instance_id
    assert len(instance) == 32
    box.close()
    with httpx.Client(base_url=service, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        gone = client.post("/step", json={"instance_id": instance, "action": {"code": "print(1)"}})
        assert gone.status_code == 404
        bad = client.post("/create", json={"env_type": "kv_store"})
        assert bad.status_code == 404 and "sandbox" in bad.text
        live = client.post("/create", json={}).json()["instance_id"]
        outside = client.post("/step", json={"instance_id": live, "action": {"read": "../etc/passwd"}})
        assert outside.status_code == 409 and "outside /sandbox" in outside.text
        missing = client.post("/step", json={"instance_id": live, "action": {"read": "nope.txt"}})
        assert missing.status_code == 409 and "FileNotFoundError" in missing.text
        client.post("/release", json={"instance_id": live})


def test_a_service_beyond_loopback_needs_a_token() -> None:
    out = subprocess.run([sys.executable, "-m", "ajet.sandbox.service", "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    assert "AJET_SANDBOX_TOKEN" in out.stderr


def test_the_shared_pool_uses_the_service_when_configured(service: str, monkeypatch) -> None:
    # configure() sets the variable: setenv undoes that after the test (a delenv of an unset
    # variable records nothing, and the service's URL leaked into later tests' subprocesses)
    monkeypatch.setenv(shared.ENV, "")
    monkeypatch.setenv(shared.TOKEN_FILE_ENV, "")
    monkeypatch.setattr(shared, "_pool", None)
    cfg = SandboxConfig(enabled=True, backend=SandboxBackend.service, service_url=service, service_token=TOKEN)
    assert "the service at" in shared.configure(cfg)
    # the token reaches this process's pool through a 0600 file, not the environment that every
    # process started from here inherits
    assert all(TOKEN not in value for value in os.environ.values())
    assert os.stat(os.environ[shared.TOKEN_FILE_ENV]).st_mode & 0o777 == 0o600

    async def episode() -> dict[str, float]:
        async with shared.shared_pool().session({"a.py": "print('from a file')"}) as box:
            result = await box.arun(["python3", "a.py"])
            assert result.stdout == "from a file\n", result
            await box.arun_python("import time\ntime.sleep(60)")
            return box.metrics()

    metrics = asyncio.run(episode())
    assert metrics["sandbox/calls"] == 2 and metrics["sandbox/timeouts"] == 1


def _conf(tmp_path: Path, body: str) -> Path:
    (tmp_path / "agent.py").write_text("from ajet import Workflow\n\n\nclass W(Workflow):\n"
                                       "    async def execute(self, task, tuner): ...\n")
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    path = tmp_path / "run.yaml"
    path.write_text("workflow:\n  target: agent.py:W\ntask_reader:\n  jsonl:\n    train_path: train.jsonl\n" + body)
    return path


def test_dry_run_checks_the_sandbox(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    conf = _conf(tmp_path, "sandbox:\n  enabled: true\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "# checked: sandbox: bubblewrap" in result.output and "no network" in result.output


def test_dry_run_without_bubblewrap_names_the_package(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    conf = _conf(tmp_path, "sandbox:\n  enabled: true\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--dry-run"])
    assert result.exit_code != 0
    assert "bubblewrap" in result.output and "apt-get install bubblewrap" in result.output


def test_the_service_backend_needs_its_url(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    conf = _conf(tmp_path, "sandbox:\n  enabled: true\n  backend: service\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--dry-run"])
    assert result.exit_code == 2
    assert "sandbox.service_url" in result.output


def test_the_service_token_is_never_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    conf = _conf(tmp_path, "sandbox:\n  service_token: hunter2\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output and "service_token: <redacted>" in result.output


# ------------------------------------------------------------------ live sessions: cap and idle TTL
class CountingPool(SandboxPool):
    """A pool that remembers the sandboxes the service gave back."""

    def __init__(self) -> None:
        super().__init__(size=1, limits=LIMITS)
        self.released: list = []

    def release(self, box) -> None:  # noqa: ANN001 - a Sandbox
        self.released.append(box)
        super().release(box)


@pytest.fixture
def served():
    """(pool, app, url) for a service built with the test's create_app options."""
    opened = []

    def serve(**options):
        pool = CountingPool()
        app = create_app(pool, TOKEN, **options)
        server = serve_in_thread(app)
        opened.append((pool, app, server))
        return pool, app, server.__enter__()

    yield serve
    for pool, app, server in opened:
        server.__exit__(None, None, None)
        app.state.sessions.close()
        pool.close()


def test_live_sessions_are_capped_with_a_message_naming_the_setting(served) -> None:
    _, app, url = served(max_sessions=2)
    first, second = RemoteSandbox(url, TOKEN).start(), RemoteSandbox(url, TOKEN).start()
    with pytest.raises(SandboxUnavailableError, match=r"503.*--max-sessions 2"):
        RemoteSandbox(url, TOKEN).start()
    assert len(app.state.sessions) == 2
    first.close()  # a released session makes room
    third = RemoteSandbox(url, TOKEN).start()
    assert third.run_python("print(1)").stdout == "1\n"
    for box in (second, third):
        box.close()
    assert len(app.state.sessions) == 0


def test_an_idle_session_is_released_after_its_ttl(served) -> None:
    pool, app, url = served(idle_ttl_s=0.3)
    box = RemoteSandbox(url, TOKEN).start()
    assert box.run_python("print(1)").stdout == "1\n"
    held = next(iter(app.state.sessions._held.values())).box
    deadline = time.monotonic() + 10
    while len(app.state.sessions) and time.monotonic() < deadline:  # the reaper runs on its own
        time.sleep(0.05)
    assert len(app.state.sessions) == 0 and pool.released == [held] and not held.alive
    with pytest.raises(SandboxUnavailableError, match=r"404.*without a call.*--idle-ttl-s"):
        box.run_python("print(1)")
    box.close()


def test_a_session_in_a_call_longer_than_the_ttl_is_not_released(served) -> None:
    pool, app, url = served(idle_ttl_s=0.3)
    box = RemoteSandbox(url, TOKEN).start()
    try:
        result = box.run_python("import time\ntime.sleep(1.2)\nprint('done')")
        assert (result.status, result.stdout) == ("ok", "done\n")
        assert box.run_python("print(2)").stdout == "2\n"  # the same session, still there
        assert pool.released == []
    finally:
        box.close()


@pytest.mark.parametrize("option", [["--max-sessions", "0"], ["--idle-ttl-s", "0"]])
def test_the_service_refuses_a_cap_or_ttl_that_cannot_hold(option, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        service_main(option)
    assert exited.value.code == 2 and option[0] in capsys.readouterr().err
