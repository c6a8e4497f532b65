"""The bridge is a sandbox's one way out: a program inside reaches the gateway the bridge names
(through the relay on the sandbox's loopback and a Unix socket bound read-only), and nothing
else of the host's network, not even another server on the host's loopback. Code in one
sandbox cannot take over the socket of a bridge that other sandboxes share."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ajet.sandbox import Limits, Sandbox
from ajet.sandbox.bridge import ModelBridge


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = f"hello from {self.server.server_address[1]} at {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    gateway, other = serve(), serve()
    yield gateway.server_address[1], other.server_address[1]
    gateway.shutdown()
    other.shutdown()


def fetch(url: str) -> str:
    return (f"import urllib.request\ntry:\n    print(urllib.request.urlopen({url!r}, timeout=3).read().decode())\n"
            f"except OSError as exc:\n    print('failed:', exc)")


def test_inside_reaches_the_gateway_and_nothing_else(servers) -> None:
    gateway, other = servers
    with ModelBridge(f"http://127.0.0.1:{gateway}/v1") as bridge, \
            Sandbox(Limits(wall_s=10, processes=16), ro_paths=bridge.ro_paths) as box:
        assert bridge.inside_url == "http://127.0.0.1:18080/v1"
        script = fetch(bridge.inside_url + "/models") + "\n" + fetch(f"http://127.0.0.1:{other}/") + "\n" + \
            fetch(f"http://127.0.0.1:{gateway}/")
        box.write_files({"probe.py": script})
        result = box.run(bridge.shell([box.python, "probe.py"], python=box.python))
        lines = result.stdout.splitlines()
        assert lines[0] == f"hello from {gateway} at /v1/models", result.as_tool_text()
        assert lines[1].startswith("failed:") and lines[2].startswith("failed:")  # the host's loopback is not there
        assert bridge.connections == 1
        # the relay died with the call: the next call finds nothing listening
        again = box.run_python(fetch(bridge.inside_url + "/models"))
        assert again.stdout.startswith("failed:")
    assert not bridge.dir.exists()


TAKE_OVER = """import os, socket
path = {path!r}
for name, attempt in [("unlink", lambda: os.unlink(path)), ("rename", lambda: os.rename(path, path + ".old")),
                      ("plant", lambda: open(os.path.join(os.path.dirname(path), "x.sock"), "w"))]:
    try:
        attempt()
        print(name, "done")
    except OSError as exc:
        print(name, "failed", exc.errno)
listener = socket.socket(socket.AF_UNIX)
try:
    listener.bind(path)
    print("listen done")
except OSError as exc:
    print("listen failed", exc.errno)
"""


def test_a_sandbox_cannot_take_over_the_socket_another_sandbox_uses(servers) -> None:
    """The audit's attack: sandbox A unlinked the shared socket and listened in its place, so
    sandbox B's model calls (and its episode key) reached A. The socket's directory is
    read-only inside now: every step of the takeover fails, and B still reaches the gateway."""
    gateway, _ = servers
    limits = Limits(wall_s=10, processes=16)
    with ModelBridge(f"http://127.0.0.1:{gateway}/v1") as bridge, \
            Sandbox(limits, ro_paths=bridge.ro_paths) as attacker, Sandbox(limits, ro_paths=bridge.ro_paths) as victim:
        took = attacker.run_python(TAKE_OVER.format(path=str(bridge.socket)))
        lines = took.stdout.splitlines()
        assert len(lines) == 4 and all(" failed " in line for line in lines), took.as_tool_text()
        assert bridge.socket.is_socket()  # still the bridge's own socket
        victim.write_files({"probe.py": fetch(bridge.inside_url + "/models")})
        result = victim.run(bridge.shell([victim.python, "probe.py"], python=victim.python))
        assert result.stdout.strip() == f"hello from {gateway} at /v1/models", result.as_tool_text()
        assert bridge.connections == 1


def test_the_bridge_forwards_to_this_machine_only() -> None:
    with pytest.raises(ValueError, match="this machine only"):
        ModelBridge("http://192.0.2.10:8000/v1")
    with pytest.raises(ValueError, match="plain http"):
        ModelBridge("https://127.0.0.1:8000/v1")
