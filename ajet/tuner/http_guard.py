"""The gateway's front door: what a request must show before one byte of its body is read.

`BodyGuard` wraps the gateway's ASGI app (uvicorn serves the wrapper; the sandbox service and the
reference env server add it as a middleware):

- a route that needs the client token (`ajet serve`'s episode API, its `/docs` and
  `/openapi.json`) without it is answered 401 before the body is read, and so is a route that
  checks its own keys (the model routes' per-episode api_keys) when the bearer key is missing or
  unknown: an unauthenticated client cannot make the server read anything;
- a path that no route of the app matches is answered 404 before the body is read (after the
  token check where one applies);
- a GET or HEAD request's body is never read (the app sees an empty one);
- every body is capped at `max_body_bytes`: a declared `Content-Length` over the cap is answered
  413 unread, and a chunked body is read only up to the cap, then answered 413;
- every body must arrive whole within `body_timeout_s` of its headers, else 408;
- every refusal carries `Connection: close`, so the server stops reading a refused body;
- the body that passes is handed to the app as it arrived.

The transport's own limits (header deadline, connection caps) are `ajet.http_server`'s.

FastAPI parses body parameters before a router's dependencies run, so these checks cannot live
in the routes: they run here, in front of the app.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.routing import Match

from ajet.http_server import ServerLimits
from ajet.tuner.openai_compat import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# What `client_token(path)` may return for a route that checks its own keys: whether a bearer key
# (the text after "Bearer ") is one the app would accept.
KeyCheck = Callable[[str], bool]
_TOKEN_HINT = ("send 'Authorization: Bearer <token>' with the server's client token (episode api_keys are "
               "for model calls only)")
_NO_BODY_METHODS = ("GET", "HEAD")


class BodyGuard:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int,
                 client_token: Callable[[str], str | KeyCheck | None],
                 body_timeout_s: float = ServerLimits.body_timeout_s,
                 key_header: str = "authorization", token_hint: str = _TOKEN_HINT) -> None:
        """`client_token(path)`: the token the route at `path` needs, a `KeyCheck` for a route
        that checks its own keys (the model routes: a per-episode api_key), or None for a route
        that needs none. `key_header`: where a client token is sent (`Authorization: Bearer
        <token>`, or the whole value of another header, e.g. the Tinker SDK's `X-API-Key`);
        `token_hint`: what a 401 for a missing or wrong client token tells the client to do."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.client_token = client_token
        self.body_timeout_s = body_timeout_s
        self.key_header = key_header.lower().encode("latin-1")
        self.token_hint = token_hint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope, headers.get(b"authorization", b""), headers.get(self.key_header, b""))
        if refusal is not None:
            await _reply(send, *refusal)
            return
        if scope.get("method") in _NO_BODY_METHODS:
            declared = headers.get(b"content-length", b"0") not in (b"", b"0") or b"transfer-encoding" in headers
            await self.app(scope, _replay(b"", receive), _closing(send) if declared else send)
            return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send)
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.body_timeout_s)
        except asyncio.TimeoutError:
            await _reply(send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                         "request_timeout")
            return
        except _TooLarge:
            await self._too_large(send)
            return
        if body is None:
            return  # the client left: nothing to answer
        await self.app(scope, _replay(body, receive), send)

    def _refusal(self, scope: Scope, authorization: bytes,
                 api_key: bytes) -> tuple[int, str, str, list[tuple[bytes, bytes]]] | None:
        """(status, message, code, headers) of a request answered before its body, or None."""
        path = scope.get("path", "")
        token = self.client_token(path)
        given = _bearer_key(authorization) if self.key_header == b"authorization" else api_key.decode("latin-1").strip()
        if isinstance(token, str) and not _key_matches(given, token):
            return (401, f"missing or wrong client token: {self.token_hint}",
                    "invalid_client_token", [(b"www-authenticate", b"Bearer")])
        if callable(token):
            key = _bearer_key(authorization)
            if not key or not token(key):
                return (401, "missing, unknown or expired API key: send 'Authorization: Bearer <key>' with "
                        "the key from tuner.base_url_and_key(role) (keys are valid only during their "
                        "episode)", "invalid_api_key", [(b"www-authenticate", b"Bearer")])
        if not _has_route(scope.get("app") or self.app, scope):
            return 404, f"no route {path}", "not_found", []
        return None

    async def _read(self, receive: Receive) -> bytes | None:
        body: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client left; nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLarge
            body.append(chunk)
            more = message.get("more_body", False)
        return b"".join(body)

    async def _too_large(self, send: Send) -> None:
        await _reply(send, 413, f"request body exceeds {self.max_body_bytes} bytes", "request_too_large")


class _TooLarge(Exception):
    """A body passed the cap while it was read."""


def _has_route(app: Any, scope: Scope) -> bool:
    """Whether a route of `app` (a Starlette app; any other app: yes) matches the path, whatever
    the method (a wrong method is the app's 405)."""
    routes = getattr(getattr(app, "router", None), "routes", None)
    if routes is None:
        return True
    probe = {**scope, "type": "http"}
    return any(route.matches(probe)[0] is not Match.NONE for route in routes)


def _closing(send: Send) -> Send:
    """`send` that adds `Connection: close` to the response (the request's body was left unread)."""
    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return closing


def _bearer_key(header: bytes) -> str | None:
    """The key of an `Authorization: Bearer <key>` header ("" when empty), or None for another scheme."""
    scheme, _, given = header.decode("latin-1").strip().partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None


def _key_matches(given: str | None, token: str) -> bool:
    """Whether the key a request showed is `token` (compared in constant time)."""
    return given is not None and secrets.compare_digest(given.encode(), token.encode())


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


async def _reply(send: Send, status: int, message: str, code: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """An OpenAI-style error body, as every other error of the gateway, that closes the
    connection: the server reads no more of a refused request."""
    body = json.dumps(error_body(message, "invalid_request_error", code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
