"""An OpenAI-compatible HTTP gateway in front of the episode sessions.

Any framework that speaks chat completions (OpenAI SDK, LangChain, raw HTTP) reaches
the local engine through it. Each (episode, role) gets its own unguessable API key;
the key routes a request to its `EpisodeSession`, so concurrent episodes never see
each other's calls, and a key dies when the runner unregisters its episode.

The server is uvicorn on a background thread with its own event loop; sessions run
their `chat` on that loop (the engine is thread- and loop-safe). `stream=true` sends content
deltas as the engine samples them when it can stream (the local engine), and the whole reply
in a few chunks otherwise; tool calls come whole at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ajet.http_server import ServerLimits, uvicorn_config, uvicorn_server
from ajet.tuner import openai_compat as wire
from ajet.tuner.errors import (
    CallLimitError,
    ContextBudgetError,
    EngineBusy,
    InvalidRequestError,
    SessionClosedError,
)
from ajet.tuner.http_guard import BodyGuard, KeyCheck
from ajet.tuner.session import EpisodeSession

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


class GatewayError(RuntimeError):
    """The gateway could not start or is used before `start()`."""


class _RequestError(Exception):
    def __init__(self, status: int, message: str, type_: str, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type_, self.code, self.param = status, message, type_, code, param

    def response(self) -> JSONResponse:
        return JSONResponse(
            wire.error_body(self.message, self.type_, self.code, self.param), status_code=self.status
        )


class Gateway:
    """`start()` → serve `POST /v1/chat/completions` and `GET /v1/models` on `base_url`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        limits: ServerLimits | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.limits = limits or ServerLimits()
        self._keys: dict[str, tuple[EpisodeSession, str]] = {}
        self._keys_lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._created = int(time.time())
        self._noted_fields: set[str] = set()  # fields outside the protocol, logged once each
        self._client_token: str | None = None  # set by `require_client_token` (the episode API)
        self.app = self._build_app()
        # What uvicorn serves: the app behind its front door (a key before the body, capped bodies).
        self.asgi = BodyGuard(self.app, max_body_bytes=max_body_bytes, client_token=self._token_for,
                              body_timeout_s=self.limits.body_timeout_s)

    # -- lifecycle -------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self._thread is None:
            raise GatewayError("the gateway is not running; call Gateway.start() first")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 30.0) -> Gateway:
        """Start serving; returns once the server accepts connections."""
        if self._thread is not None:
            return self
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only for
        # it; without it every small response waits ~40 ms for a delayed ACK (Nagle).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as err:
            sock.close()
            raise GatewayError(
                f"cannot bind the gateway to {self.host}:{self.port}: {err}"
            ) from err
        self.port = sock.getsockname()[1]
        # header and idle deadlines, connection caps, the fd limit raised (ajet.http_server)
        config = uvicorn_config(self.asgi, self.limits, lifespan="off", loop="asyncio")
        self._server = uvicorn_server(config, self.limits)
        self._socket = sock
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="ajet-gateway", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise GatewayError(
                    f"the gateway on {self.host}:{self.port} did not start within {timeout_s} s"
                )
            time.sleep(0.01)
        log.info("gateway serving on %s", self.base_url)
        return self

    def require_client_token(self, token: str) -> None:
        """From now on the episode API, /docs and /openapi.json answer only requests that carry
        `token` (checked before the body is read: `ajet.tuner.http_guard`)."""
        self._client_token = token

    def _token_for(self, path: str) -> str | KeyCheck | None:
        """What the route at `path` needs before its body is read: the client token (the episode
        API), a live episode key (the model routes), or nothing."""
        if path in ("/v1/chat/completions", "/v1/models"):
            return self._key_is_live
        guarded = path in ("/docs", "/openapi.json", "/v1/status") or path.startswith("/v1/episodes")
        return self._client_token if guarded else None

    def _key_is_live(self, key: str) -> bool:
        with self._keys_lock:
            entry = self._keys.get(key)
        return entry is not None and not entry[0].closed

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None
        with self._keys_lock:
            self._keys.clear()

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- keys ------------------------------------------------------------------
    def register(self, session: EpisodeSession, role: str) -> str:
        """A new API key routing to `session` as `role`."""
        key = secrets.token_urlsafe(32)
        with self._keys_lock:
            self._keys[key] = (session, role)
        return key

    def unregister_session(self, session: EpisodeSession) -> int:
        """Drop every key of `session`; returns how many."""
        with self._keys_lock:
            dead = [k for k, (s, _) in self._keys.items() if s is session]
            for key in dead:
                del self._keys[key]
        return len(dead)

    def _lookup(self, request: Request) -> tuple[EpisodeSession, str]:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise _RequestError(
                401,
                "missing API key: send 'Authorization: Bearer <key>' with the key from "
                "tuner.base_url_and_key(role)",
                "invalid_request_error",
                "invalid_api_key",
            )
        with self._keys_lock:
            entry = self._keys.get(key.strip())
        if entry is None or entry[0].closed:
            raise _RequestError(
                401,
                "unknown or expired API key (keys are valid only during their episode)",
                "invalid_request_error",
                "invalid_api_key",
            )
        return entry

    # -- HTTP ------------------------------------------------------------------
    def include_router(self, router: Any) -> None:
        """Serve more routes (the episode API, `ajet.serve.http`) on this gateway, and
        their OpenAPI schema at /openapi.json with Swagger UI at /docs. Works while serving."""
        app = self.app
        app.include_router(router)

        async def invalid_body(request: Request, exc: Exception) -> JSONResponse:
            # OpenAI-style like every other error here, not FastAPI's {"detail": [...]}.
            return JSONResponse(wire.error_body(_validation_message(exc), "invalid_request_error"), 422)

        app.add_exception_handler(RequestValidationError, invalid_body)
        app.openapi_schema = None  # rebuilt with the new routes
        if app.openapi_url is None:
            openapi_url = app.openapi_url = "/openapi.json"

            async def openapi(request: Request) -> JSONResponse:
                return JSONResponse(app.openapi())

            async def docs(request: Request) -> Any:
                return get_swagger_ui_html(openapi_url=openapi_url, title=f"{app.title} - docs")

            app.add_route(openapi_url, openapi, include_in_schema=False)
            app.add_route("/docs", docs, include_in_schema=False)

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="ajet gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(StarletteHTTPException)
        async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            body = wire.error_body(str(exc.detail), "invalid_request_error", getattr(exc, "code", None))
            return JSONResponse(body, exc.status_code, headers=exc.headers)

        @app.get("/v1/models")
        async def models(request: Request) -> JSONResponse:
            try:
                self._lookup(request)
            except _RequestError as err:
                return err.response()
            return JSONResponse(wire.models_response(self._created))

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Any:
            try:
                session, role = self._lookup(request)
            except _RequestError as err:
                return err.response()
            try:
                body = await self._read_json(request)
            except _RequestError as err:  # refused before it reached the session: counted there too
                session.refuse(err.message, err.param or "request")
                return err.response()
            try:
                return await self._complete(session, role, body)
            except _RequestError as err:
                return err.response()

        return app

    async def _read_json(self, request: Request) -> wire.RequestBody:
        # The body arrives capped at max_body_bytes (`BodyGuard`, in front of the app).
        try:
            payload = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise _RequestError(
                400, f"request body is not valid JSON: {err}", "invalid_request_error"
            ) from err
        if not isinstance(payload, dict):
            raise _RequestError(400, "request body must be a JSON object", "invalid_request_error")
        if (refused := wire.refused_field(payload)) is not None:
            name, why = refused
            raise _RequestError(400, f"{why} (docs/gateway.md lists each field)", "invalid_request_error",
                                "unsupported_parameter", name)
        try:
            req = wire.ChatCompletionRequest.model_validate(payload)
        except ValidationError as err:
            raise _RequestError(400, _validation_message(err), "invalid_request_error", None,
                                _validation_field(err)) from err
        if req.top_logprobs and not req.logprobs:
            raise _RequestError(400, "top_logprobs needs logprobs=true (as OpenAI and vLLM)", "invalid_request_error",
                                "invalid_value", "top_logprobs")
        if req.logprobs and req.stream:
            raise _RequestError(400, "logprobs with stream=true is not supported; stream without logprobs, "
                                "or ask for them without streaming", "invalid_request_error",
                                "unsupported_parameter", "logprobs")
        self._note_extra_fields(payload)
        return req

    def _note_extra_fields(self, payload: dict) -> None:
        """Log, once per name, a field outside the protocol: accepted and ignored (as vLLM does)."""
        for name in payload.keys() - wire.PROTOCOL_FIELDS - self._noted_fields:
            self._noted_fields.add(name)
            log.warning("gateway: the request field %r is not part of the chat-completions protocol; "
                        "ignored (docs/gateway.md lists each field)", name)

    async def _chat(self, session: EpisodeSession, role: str, req: wire.RequestBody,
                    on_text: Any = None) -> Any:
        """The session's chat call, with its errors as HTTP errors."""
        try:
            return await session.chat(
                role,
                req.messages,
                req.tools,
                tool_choice=req.tool_choice,
                response_format=req.response_format,
                parallel_tool_calls=req.parallel_tool_calls,
                on_text=on_text,
                **req.sampling_overrides(),
            )
        except SessionClosedError as err:
            raise _RequestError(401, str(err), "invalid_request_error", "invalid_api_key") from err
        except CallLimitError as err:
            raise _RequestError(429, str(err), "invalid_request_error", "too_many_calls") from err
        except EngineBusy as err:
            raise _RequestError(429, str(err), "rate_limit_error", "engine_busy") from err
        except ContextBudgetError as err:
            raise _RequestError(400, str(err), "invalid_request_error", "context_length_exceeded", "messages") from err
        except InvalidRequestError as err:  # a field the session refused (counted there, by the field)
            raise _RequestError(400, str(err), "invalid_request_error", err.code, err.param) from err
        except ValueError as err:  # a prompt the engine rejects
            raise _RequestError(400, str(err), "invalid_request_error") from err
        except Exception as err:  # noqa: BLE001 - reported to the client as a 500, and logged
            log.exception("gateway: chat call of episode %s failed", session.episode_id)
            raise _RequestError(500, f"{type(err).__name__}: {err}", "server_error") from err

    async def _complete(
        self, session: EpisodeSession, role: str, req: wire.RequestBody
    ) -> Any:
        completion_id = wire.new_completion_id()
        if not req.stream:
            result = await self._chat(session, role, req)
            logprobs = None
            if req.logprobs:
                ids = result.call.completion_ids
                alternatives = [list(zip(session.token_texts([i for i, _ in top]), [lp for _, lp in top], strict=True))
                                for top in result.top_logprobs]
                logprobs = wire.logprobs_content(session.token_texts(ids), result.call.completion_logprobs,
                                                 alternatives)
            return JSONResponse(
                wire.completion_response(
                    result.message,
                    result.finish_reason,
                    result.usage,
                    model=req.model,
                    completion_id=completion_id,
                    logprobs=logprobs,
                )
            )
        return await self._stream(session, role, req, completion_id)

    async def _stream(self, session: EpisodeSession, role: str, req: wire.RequestBody,
                      completion_id: str) -> Any:
        """`stream=true`: content deltas as the engine samples them (`ajet.tuner.streaming`),
        then the rest of the reply (tool calls, finish, usage) when it is done. An error before
        the first delta is an HTTP error, as without streaming; after it, an SSE error event."""
        created = int(time.time())
        deltas: asyncio.Queue[str] = asyncio.Queue()
        call = asyncio.ensure_future(self._chat(session, role, req, on_text=deltas.put_nowait))
        first = asyncio.ensure_future(deltas.get())
        await asyncio.wait({call, first}, return_when=asyncio.FIRST_COMPLETED)

        def finished(sent: str, with_role: bool) -> list[str]:
            try:
                result = call.result()
            except _RequestError as err:
                return [wire.sse(wire.error_body(err.message, err.type_, err.code)), wire.SSE_DONE]
            return wire.sse_lines(wire.stream_chunks(
                result.message, result.finish_reason, result.usage if req.include_usage else None,
                model=req.model, completion_id=completion_id, sent=sent, with_role=with_role,
                created=created))

        if not first.done():  # finished without a delta (e.g. a tool call): all at once
            first.cancel()
            if (error := call.exception()) is not None:
                raise error
            lines = finished("", with_role=True)

            async def whole() -> Any:
                for line in lines:
                    yield line

            return StreamingResponse(whole(), media_type="text/event-stream")

        def content(delta: str) -> str:
            return wire.sse(wire.stream_chunk({"content": delta}, model=req.model,
                                              completion_id=completion_id, created=created))

        async def events() -> Any:
            sent = first.result()
            yield wire.sse(wire.stream_chunk({"role": "assistant", "content": ""}, model=req.model,
                                             completion_id=completion_id, created=created))
            yield content(sent)
            while True:
                getter = asyncio.ensure_future(deltas.get())
                await asyncio.wait({call, getter}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                sent += getter.result()
                yield content(getter.result())
            while not deltas.empty():  # tokens that arrived with the result
                delta = deltas.get_nowait()
                sent += delta
                yield content(delta)
            for line in finished(sent, with_role=False):
                yield line

        return StreamingResponse(events(), media_type="text/event-stream")


def _validation_field(err: ValidationError) -> str | None:
    """The top-level field of a pydantic error's first problem (None: the body as a whole)."""
    errors = err.errors()
    where = errors[0].get("loc", ()) if errors else ()
    return where[0] if where and isinstance(where[0], str) else None


def _validation_message(err: Any) -> str:
    """The first few problems of a pydantic `ValidationError` or FastAPI `RequestValidationError`."""
    parts = []
    for e in err.errors()[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{where}: {e.get('msg')}")
    return "invalid request: " + "; ".join(parts)
