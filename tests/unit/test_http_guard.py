"""The gateway's front door (`ajet.tuner.http_guard.BodyGuard`, issue 53): before, FastAPI read a
whole body (chunked, any size) before the episode API's token check answered 401, and a body
whose Content-Length claimed ~1 GB was read before the 413. Now a request without the client
token, or with too large a body, is answered before the body is read (or as soon as the cap is
passed), counted here in the bytes the app pulled from the connection."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ajet.tuner.http_guard import BodyGuard

CAP = 1024
TOKEN = "s3cret"


def call(path: str, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, dict, int, list[bytes]]:
    """Run one request through BodyGuard around an echo app: (status, body, bytes pulled, what the app got)."""
    pulled = [0]
    seen: list[bytes] = []
    queue = list(chunks)

    async def receive() -> dict[str, Any]:
        if not queue:
            return {"type": "http.disconnect"}
        chunk = queue.pop(0)
        pulled[0] += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(queue)}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = BodyGuard(app, max_body_bytes=CAP, client_token=lambda p: TOKEN if p.startswith("/v1/episodes") else None)
    scope = {"type": "http", "path": path, "method": "POST",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(guard(scope, receive, send))
    body = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    return sent[0]["status"], body, pulled[0], seen


def test_no_token_is_answered_401_before_one_byte_of_the_body_is_read() -> None:
    big = [b"x" * 65536] * 1024  # 64 MiB, chunked
    status, body, pulled, seen = call("/v1/episodes/a-e0/finish", {}, big)
    assert (status, body["error"]["code"], pulled, seen) == (401, "invalid_client_token", 0, [])
    status, _, pulled, _ = call("/v1/episodes/a-e0/finish", {"Authorization": "Bearer wrong"}, big)
    assert (status, pulled) == (401, 0)


def test_a_declared_length_over_the_cap_is_413_unread_and_a_chunked_one_stops_at_the_cap() -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, body, pulled, _ = call("/v1/episodes", {**auth, "Content-Length": "999999999"}, [b"x" * 65536])
    assert (status, body["error"]["code"], pulled) == (413, "request_too_large", 0)
    status, _, pulled, seen = call("/v1/episodes", auth, [b"x" * 512] * 1000)  # 500 KB in 512 B chunks
    assert status == 413 and CAP < pulled <= CAP + 512 and seen == []


def test_a_body_within_the_cap_reaches_the_app_whole() -> None:
    status, body, _, seen = call("/v1/episodes", {"Authorization": f"Bearer {TOKEN}"}, [b'{"a":', b" 1}"])
    assert (status, body, seen) == (200, {"ok": True}, [b'{"a": 1}'])
    # a route without a client token (the model routes check their own api_key) is capped too
    status, _, _, seen = call("/v1/chat/completions", {}, [b"{}"])
    assert (status, seen) == (200, [b"{}"])
    assert call("/v1/chat/completions", {}, [b"x" * 2048])[0] == 413


# -- issue 69 §3: nothing read for a request that cannot be served, and refusals close -------------
def run_guard(guard: BodyGuard, scope: dict[str, Any], receive: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent


def never_read() -> Any:
    async def receive() -> dict[str, Any]:
        raise AssertionError("the body was read")
    return receive


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": message["body"]})


def test_a_route_with_its_own_keys_needs_a_live_bearer_key_before_the_body() -> None:
    guard = BodyGuard(ok_app, max_body_bytes=CAP, client_token=lambda p: (lambda key: key == "live"))
    for headers in ([], [(b"authorization", b"Bearer dead")], [(b"authorization", b"Basic live")]):
        sent = run_guard(guard, {"type": "http", "path": "/v1/chat/completions", "method": "POST",
                                 "headers": headers}, never_read())
        assert sent[0]["status"] == 401 and (b"connection", b"close") in sent[0]["headers"]


def test_unknown_paths_and_get_bodies_are_not_read() -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    guard = BodyGuard(app, max_body_bytes=CAP, client_token=lambda p: None)
    sent = run_guard(guard, {"type": "http", "path": "/nope", "method": "POST", "headers": []}, never_read())
    assert sent[0]["status"] == 404 and (b"connection", b"close") in sent[0]["headers"]
    scope = {"type": "http", "path": "/health", "method": "GET", "query_string": b"", "root_path": "",
             "headers": [(b"content-length", b"4000000")]}
    sent = run_guard(guard, scope, never_read())
    assert sent[0]["status"] == 200 and (b"connection", b"close") in sent[0]["headers"]


def test_a_body_that_does_not_arrive_in_time_is_answered_408() -> None:
    async def trickle() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b"x", "more_body": True}

    guard = BodyGuard(ok_app, max_body_bytes=CAP, client_token=lambda p: None, body_timeout_s=0.3)
    sent = run_guard(guard, {"type": "http", "path": "/x", "method": "POST", "headers": []}, trickle)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
