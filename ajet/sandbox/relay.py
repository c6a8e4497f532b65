"""A byte relay between a TCP address and a Unix socket, both ways (standard library only: it
also runs inside the sandbox, on the sandbox's interpreter).

    python relay.py tcp:127.0.0.1:8080 unix:/run/ajet/model.sock    # listen, connect

A sandbox has no network: its namespace has only its own loopback. A harness that must reach
the model (a CLI coding agent) gets one way out: inside, this relay listens on the sandbox's
loopback and forwards each connection to a Unix socket bound into the sandbox; outside,
`ajet.sandbox.bridge.ModelBridge` listens on that socket and forwards to the gateway. Nothing
else of the host's network is reachable.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the annotations are never evaluated: any interpreter the sandbox has runs this
    from collections.abc import Callable
    from typing import Literal

    Address = tuple[Literal["unix"], str] | tuple[Literal["tcp"], tuple[str, int]]  # (kind, path or (host, port))


def parse(address: str) -> Address:
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return ("unix", rest)
    host, _, port = rest.rpartition(":")
    if kind == "tcp" and host and port.isdigit():
        return ("tcp", (host, int(port)))
    raise ValueError(f"not an address: {address!r} (tcp:HOST:PORT or unix:PATH)")


async def open_to(address: Address) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address[0] == "unix":
        return await asyncio.open_unix_connection(address[1])
    return await asyncio.open_connection(*address[1])


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError, RuntimeError):
            pass


async def start(listen: str | Address, connect: str | Address,
                on_connect: Callable[[], None] | None = None) -> asyncio.Server:
    """The listening server: each connection to `listen` is piped to a new one to `connect`
    (`on_connect()` is called for each)."""
    target = parse(connect) if isinstance(connect, str) else connect

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if on_connect is not None:
            on_connect()
        try:
            up_reader, up_writer = await open_to(target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    address = parse(listen) if isinstance(listen, str) else listen
    if address[0] == "unix":
        return await asyncio.start_unix_server(handle, path=address[1])
    return await asyncio.start_server(handle, *address[1])


async def serve(listen: str, connect: str) -> None:
    server = await start(listen, connect)
    ready = os.environ.get("AJET_RELAY_READY")
    if ready:  # a file that says "listening" to the shell that waits for it
        open(ready, "w").close()
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: relay.py LISTEN CONNECT  (tcp:HOST:PORT or unix:PATH each)")
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
