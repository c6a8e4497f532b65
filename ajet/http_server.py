"""What every ajet HTTP server (the gateway of `ajet train`/`ajet serve`, the sandbox service, the
reference env server) shares against clients that connect and then hold the connection:

- a **header deadline**: a connection must complete a request's headers within
  `header_timeout_s` of connecting or of its last answer, else it is closed. uvicorn has no such
  option, and its keep-alive timer is disarmed by every byte, so a client sending its headers a
  byte a second (slowloris) held a connection forever;
- **connection caps**, overall and per peer address, checked when a connection is accepted: at a
  cap the connection that has waited longest without sending a whole request (idle or still
  sending headers) is closed to make room, one that never sent a whole request before one kept
  alive after an answer (every refusal closes its connection, so only a served client keeps
  one), and only when every connection is busy with a request is the new one refused. A flood of idle sockets thus costs the server at most `max_connections`
  file descriptors (well below the fd limit the trainer shares in `ajet serve`), and never locks
  out a client that sends its request at once;
- the process's soft `RLIMIT_NOFILE` raised to its hard limit when a server starts;
- the event loop's error log rate-limited (at most one line per message per `log_every_s`): when
  the fd table was full, asyncio logged the same accept error ~10,000 times a second.

What a request must show before its body is read (a bearer key, a body cap, a body-read
deadline) is the ASGI side, `ajet.tuner.http_guard.BodyGuard`. uvicorn is imported inside the
functions: `ajet --help` imports this module's importers without starting a server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import uvicorn

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The transport limits of one server (docs/gateway.md, "Limits under load")."""

    header_timeout_s: float = 10.0  # connect (or last answer) -> a request's complete headers
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    body_timeout_s: float = 30.0  # a request's whole body (BodyGuard), from its headers on
    max_connections: int = 0  # 0: min(1024, the soft fd limit / 4) once the limit is raised
    max_per_peer: int = 0  # 0: max_connections / 2
    max_header_bytes: int = 16 * 1024  # h11's cap on an incomplete request head (uvicorn's default)
    # the listen backlog, which is also how many connections asyncio accepts in one loop tick:
    # uvicorn's 2048 let one burst of a flood evict a client's new connection before its request,
    # already sent, was read
    backlog: int = 128
    log_every_s: float = 10.0  # the event loop's error log: one line per message per this

    def resolved(self) -> ServerLimits:
        """These limits with the 0s filled in from the (raised) fd limit."""
        total = self.max_connections or max(16, min(1024, raise_fd_limit() // 4))
        return dataclasses.replace(self, max_connections=total, max_per_peer=self.max_per_peer or max(1, total // 2))


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (once a process has one, a flood of
    sockets cannot starve it of fds below it); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as err:  # a sandbox may forbid it: keep the soft limit
            log.debug("could not raise RLIMIT_NOFILE %d -> %d: %s", soft, hard, err)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class _Registry:
    """One server's connections: counts per peer, and those waiting for a request, oldest first."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.open: dict[Any, str] = {}  # protocol -> peer
        self.per_peer: dict[str, int] = {}
        # waiting for a request (idle or sending headers), oldest first: those that never sent
        # a whole request, and those kept alive after an answer (evicted after the first kind)
        self.fresh: OrderedDict[Any, None] = OrderedDict()
        self.kept: OrderedDict[Any, None] = OrderedDict()
        self.refused = self.evicted = self.timed_out = 0
        self._reported = 0.0

    def admit(self, proto: Any, peer: str) -> bool:
        """Whether `proto` may open; at a cap the longest-waiting connection makes room."""
        if self.per_peer.get(peer, 0) >= self.limits.max_per_peer and not self._evict(peer):
            return self._refuse(peer)
        if len(self.open) >= self.limits.max_connections and not self._evict(None):
            return self._refuse(peer)
        self.open[proto] = peer
        self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        return True

    def _evict(self, peer: str | None) -> bool:
        candidates = (p for waiting in (self.fresh, self.kept) for p in waiting)
        victim = next((p for p in candidates if peer is None or self.open.get(p) == peer), None)
        if victim is None:
            return False
        self.evicted += 1
        self.remove(victim)
        victim.close_quietly()
        self._report()
        return True

    def _refuse(self, peer: str) -> bool:
        self.refused += 1
        self._report()
        return False

    def remove(self, proto: Any) -> None:
        self.fresh.pop(proto, None)
        self.kept.pop(proto, None)
        peer = self.open.pop(proto, None)
        if peer is not None:
            left = self.per_peer[peer] - 1
            if left:
                self.per_peer[peer] = left
            else:
                del self.per_peer[peer]

    def wait(self, proto: Any, waiting: bool, served: bool = False) -> None:
        """`proto` now waits for a request (`served`: after an answer), or no longer does."""
        self.fresh.pop(proto, None)
        self.kept.pop(proto, None)
        if waiting and proto in self.open:
            (self.kept if served else self.fresh)[proto] = None

    def _report(self) -> None:
        now = time.monotonic()
        if now - self._reported >= self.limits.log_every_s:
            self._reported = now
            log.warning("connection caps (%d in all, %d a peer) reached: %d connections refused and %d "
                        "waiting ones closed so far; %d closed for no request within %.0f s",
                        self.limits.max_connections, self.limits.max_per_peer, self.refused, self.evicted,
                        self.timed_out, self.limits.header_timeout_s)


def _protocol_class(limits: ServerLimits) -> type:
    """uvicorn's h11 protocol with the header deadline and the caps, for one server."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    registry = _Registry(limits)

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _admitted = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peername = transport.get_extra_info("peername")
            peer = str(peername[0]) if isinstance(peername, tuple) else str(peername)
            if not registry.admit(self, peer):
                transport.abort()  # before uvicorn counts it: its fd is freed at once
                return
            self._admitted = True
            super().connection_made(transport)
            self._await_request(served=False)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            registry.remove(self)
            if self._admitted:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._admitted:
                super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self._deadline is not None and self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # a request's headers are in: the body has its own deadline (BodyGuard)
                registry.wait(self, False)

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._await_request(served=True)  # before uvicorn may start a pipelined request
            super().on_response_complete()

        def _await_request(self, served: bool) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._header_timeout)
            registry.wait(self, True, served)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _header_timeout(self) -> None:
            self._deadline = None
            registry.timed_out += 1
            registry.remove(self)
            self.close_quietly()

        def close_quietly(self) -> None:
            """Close without an answer: the client sent no whole request to answer."""
            self._disarm()
            if self.transport is not None and not self.transport.is_closing():
                try:
                    self.conn.send(h11.ConnectionClosed())
                except h11.LocalProtocolError:
                    pass  # mid-request: nothing more to tell h11
                self.transport.close()

    return GuardedH11Protocol


def uvicorn_config(app: Any, limits: ServerLimits | None = None, **kwargs: Any) -> uvicorn.Config:
    """A `uvicorn.Config` for `app` with `limits` (defaults: `ServerLimits()`); `kwargs` go to uvicorn
    (host, port, log_level, ...). HTTP/1.1 by h11 only (no websockets, no httptools), so the
    deadline and the caps hold whatever extras are installed."""
    import uvicorn

    limits = (limits or ServerLimits()).resolved()
    kwargs.setdefault("log_level", "warning")
    kwargs.setdefault("access_log", False)
    return uvicorn.Config(
        app, http=_protocol_class(limits), ws="none", timeout_keep_alive=max(1, round(limits.keep_alive_s)),
        h11_max_incomplete_event_size=limits.max_header_bytes, backlog=limits.backlog, **kwargs)


def uvicorn_server(config: uvicorn.Config, limits: ServerLimits | None = None) -> uvicorn.Server:
    """A `uvicorn.Server` whose event loop logs each error message at most once per
    `limits.log_every_s` (with the count of the ones left out)."""
    import uvicorn

    every = (limits or ServerLimits()).log_every_s

    class Server(uvicorn.Server):
        async def serve(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(_RateLimitedHandler(every))
            await super().serve(sockets)

    return Server(config)


def serve(app: Any, host: str, port: int, limits: ServerLimits | None = None, **kwargs: Any) -> None:
    """Serve `app` on host:port until interrupted, with `limits`: `uvicorn.run` for ajet's servers."""
    uvicorn_server(uvicorn_config(app, limits, host=host, port=port, **kwargs), limits).run()


class _RateLimitedHandler:
    """An asyncio exception handler: the default one, at most once per message per `every_s`."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.last: dict[str, tuple[float, int]] = {}  # message -> (last logged, left out since)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        now = time.monotonic()
        logged, skipped = self.last.get(message, (-self.every_s, 0))
        if now - logged < self.every_s:
            self.last[message] = (logged, skipped + 1)
            return
        self.last[message] = (now, 0)
        if skipped:
            context = {**context, "message": f"{message} ({skipped} more in the last {now - logged:.0f} s)"}
        loop.default_exception_handler(context)
