"""The bridge is a sandbox's one way out: a program inside reaches the gateway the bridge names
(through the relay on the sandbox's loopback and a bound Unix socket), and nothing else of the
host's network, not even another server on the host's loopback."""

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
            Sandbox(Limits(wall_s=10, processes=16), binds=bridge.binds) as box:
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


def test_the_bridge_forwards_to_this_machine_only() -> None:
    with pytest.raises(ValueError, match="this machine only"):
        ModelBridge("http://192.0.2.10:8000/v1")
    with pytest.raises(ValueError, match="plain http"):
        ModelBridge("https://127.0.0.1:8000/v1")
