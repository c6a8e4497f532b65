"""The gateway's front door: what a request must show before one byte of its body is read.

`BodyGuard` wraps the gateway's ASGI app (uvicorn serves the wrapper):

- a route that needs the client token (`ajet serve`'s episode API, its `/docs` and
  `/openapi.json`) without it is answered 401 before the body is read, so an unauthenticated
  client cannot make the server read anything;
- every body is capped at `max_body_bytes`: a declared `Content-Length` over the cap is answered
  413 unread, and a chunked body is read only up to the cap, then answered 413;
- the body that passes is handed to the app as it arrived.

FastAPI parses body parameters before a router's dependencies run, so these checks cannot live
in the routes: they run here, in front of the app.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ajet.tuner.openai_compat import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyGuard:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int,
                 client_token: Callable[[str], str | None]) -> None:
        """`client_token(path)`: the token the route at `path` needs, or None for a route that
        checks its own key (the model routes: a per-episode api_key) or needs none."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.client_token = client_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        token = self.client_token(scope.get("path", ""))
        if token is not None and not _bearer_matches(headers.get(b"authorization", b""), token):
            await _reply(send, 401, "missing or wrong client token: send 'Authorization: Bearer <token>' with "
                         "the server's client token (episode api_keys are for model calls only)",
                         "invalid_client_token", [(b"www-authenticate", b"Bearer")])
            return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send)
            return
        body: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(send)
                return
            body.append(chunk)
            more = message.get("more_body", False)
        await self.app(scope, _replay(b"".join(body), receive), send)

    async def _too_large(self, send: Send) -> None:
        await _reply(send, 413, f"request body exceeds {self.max_body_bytes} bytes", "request_too_large",
                     [(b"connection", b"close")])


def _bearer_matches(header: bytes, token: str) -> bool:
    """Whether `Authorization: Bearer <given>` carries `token` (compared in constant time)."""
    scheme, _, given = header.decode("latin-1").strip().partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), token.encode())


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the real channel (a disconnect while the reply streams)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reply(send: Send, status: int, message: str, code: str, headers: list[tuple[bytes, bytes]]) -> None:
    """An OpenAI-style error body, as every other error of the gateway."""
    body = json.dumps(error_body(message, "invalid_request_error", code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})
