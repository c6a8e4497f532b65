"""`ajet(*args)` for tests that run the CLI: like `subprocess.run([python, -m, ajet.cli.main, ...])`
(a CompletedProcess with stdout, stderr and the exit code), but each run is a child of this
test process's fork server (tests/integration/fork_server.py: ajet, torch and transformers
imported once), so it costs its own work, not the imports (~5 s on AMX, ~15 s on the AVX2-only
type). OMP_NUM_THREADS=1 and CI=true, as the subprocess helpers set them."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = Path(__file__).with_name("fork_server.py")
_lock = threading.Lock()
_server: subprocess.Popen | None = None


def _started() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
        env.pop("AJET_FAULT", None)
        _server = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env=env, cwd=Path(__file__).parents[2])
        assert json.loads(_server.stdout.readline()) == {"ready": True}
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.stdin.close()
        server.wait(timeout=30)


def ajet(*args: str, timeout: int = 600, env: dict[str, str] | None = None,
         cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run `ajet *args`; raises subprocess.TimeoutExpired past `timeout` seconds."""
    with _lock, tempfile.TemporaryDirectory(prefix="ajet_cli_") as tmp:
        server = _started()
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        request = {"argv": list(args), "env": dict(env or {}), "cwd": str(cwd or os.getcwd()), "log": str(err),
                   "out": str(out), "timeout_s": timeout}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        rc = int(json.loads(server.stdout.readline())["rc"])
        stdout = out.read_text(errors="replace") if out.is_file() else ""
        stderr = err.read_text(errors="replace") if err.is_file() else ""
    argv = [sys.executable, "-m", "ajet.cli.main", *args]
    if rc == -999:
        raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
    return subprocess.CompletedProcess(argv, rc, stdout, stderr)
