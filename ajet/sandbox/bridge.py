"""The one way out of a sandbox: a harness inside (a CLI coding agent) reaches ajet's model
gateway, and nothing else.

    with ModelBridge(base_url) as bridge:                      # the gateway, e.g. http://127.0.0.1:8000/v1
        box = Sandbox(limits, ro_paths=bridge.ro_paths).start()
        box.run(bridge.shell(["opencode", "run", "fix the bug"], env={"HOME": "/sandbox/home"}))
        # inside, the harness calls bridge.inside_url (http://127.0.0.1:18080/v1)

The sandbox keeps its own network namespace (no route anywhere). The bridge listens on a Unix
socket in a private directory that is bound into the sandbox READ-ONLY, at the same path: a
connect() works through a read-only mount, but an unlink, a rename or a bind() of a socket in
its place fails (EROFS), so code in one sandbox cannot take the socket over and listen in the
bridge's place for the model calls (and episode keys) of another sandbox on the same bridge.
The relay (`relay.py`) started inside listens on the sandbox's loopback and forwards to the
socket; the bridge forwards to the gateway. The gateway still checks the episode's API key on
every call.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ajet.net import is_loopback
from ajet.sandbox import relay
from ajet.sandbox.box import RELAY_AT

INSIDE_PORT = 18080


class ModelBridge:
    """A Unix socket (its directory shown read-only in sandboxes, at the same path) forwarded to
    `base_url`'s host and port. One bridge serves any number of sandboxes; close it when they
    are done."""

    def __init__(self, base_url: str, inside_port: int = INSIDE_PORT) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname or not url.port:
            raise ValueError(f"the bridge forwards plain http to a host:port, not {base_url!r}")
        if not is_loopback(url.hostname):
            raise ValueError(f"the bridge forwards to a gateway on this machine only, not {url.hostname}")
        self.target = (url.hostname, url.port)
        self.path = url.path.rstrip("/")
        self.inside_port = inside_port
        self.dir = Path(tempfile.mkdtemp(prefix="ajet-bridge-"))
        self.dir.chmod(0o700)
        self.socket = self.dir / "model.sock"
        self.connections = 0  # connections made through the bridge (0: the harness never called)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def ro_paths(self) -> list[str]:
        """What `Sandbox(ro_paths=...)` needs: the socket's directory, read-only at the same path.
        Never bind it writable (`Sandbox(binds=...)`): code inside could then unlink the socket
        and listen in its place."""
        return [str(self.dir)]

    @property
    def inside_url(self) -> str:
        """The gateway's base URL as seen from inside the sandbox."""
        return f"http://127.0.0.1:{self.inside_port}{self.path}"

    def start(self) -> ModelBridge:
        ready = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(relay.start(("unix", str(self.socket)), ("tcp", self.target),
                                                    on_connect=self._count))
            except BaseException as exc:  # noqa: BLE001 - re-raised by start()
                failed.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name="ajet-model-bridge", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failed:
            raise failed[0]
        return self

    def _count(self) -> None:
        self.connections += 1

    def shell(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str = "",
              python: str = "python3") -> str:
        """A shell line for `Sandbox.run`: start the relay on the sandbox's loopback, wait until
        it listens, then exec `argv` (with `env`, in `cwd`). The call's end kills the relay.
        `python`: the sandbox's interpreter (`Sandbox.python`), which runs the relay."""
        ready = "/tmp/.ajet-relay-ready"
        relay = (f"AJET_RELAY_READY={ready} {shlex.quote(python)} -I {RELAY_AT} tcp:127.0.0.1:{self.inside_port} "
                 f"{shlex.quote('unix:' + str(self.socket))} &")
        wait = f"i=0; while [ ! -e {ready} ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done"
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in (env or {}).items())
        move = f"cd {shlex.quote(cwd)} && " if cwd else ""
        return f"{relay} {wait}; {move}exec env {exports} {shlex.join(argv)}"

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ModelBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
