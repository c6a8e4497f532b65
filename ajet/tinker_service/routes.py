"""The HTTP face of `ajet tinker`: the REST routes the pinned Tinker SDK (0.38) calls, each a
few lines over `TinkerService`.

JSON requests are validated with the SDK's own request models (`tinker.types`, which forbid
unknown fields), so a field this service does not know is a 400 that names it; `forward_backward`
arrives as protobuf (`ajet.tinker_service.wire`). Every path the SDK may call that is not served
here answers 400 `not_served` naming it; a refused request never reaches the trainer.

The app is wrapped by `ajet.tuner.http_guard.BodyGuard` (built in `app()`): the SDK's
`X-API-Key` is checked on every path before a byte of the body is read, and bodies are capped.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from tinker import types

from ajet.tinker_service.errors import BadRequestError, NotServedError, TinkerServiceError
from ajet.tinker_service.futures import Failure
from ajet.tinker_service.service import TinkerService
from ajet.tinker_service.wire import PROTOBUF, decode_forward_backward
from ajet.tuner.http_guard import BodyGuard
from ajet.tuner.openai_compat import error_body

log = logging.getLogger(__name__)

# The server's feature flags for the SDK (`ClientConfigResponse`): API keys (no JWT exchange),
# plain httpx, uncompressed protobuf, one `retrieve_future` per request, custom losses on the
# client, fwd/bwd chunks of at most 4 MB.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
                 "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                 "sample_join_sampling_session": False, "fwdbwd_max_chunk_bytes_count": 4_000_000,
                 "parallel_fwdbwd_chunks": True}
TOKEN_HINT = "set TINKER_API_KEY to the key `ajet tinker` printed at start (the SDK sends it as X-API-Key)"


def app(service: TinkerService, api_key: str, max_body_bytes: int) -> BodyGuard:
    """The ASGI app to serve: the routes behind the key and the body cap."""
    api = FastAPI(title="ajet tinker", docs_url=None, redoc_url=None, openapi_url=None)
    add_routes(api, service)
    return BodyGuard(api, max_body_bytes=max_body_bytes, client_token=lambda path: api_key,
                     key_header="x-api-key", token_hint=TOKEN_HINT)


def _parse(model: type[BaseModel], body: Any) -> dict[str, Any]:
    try:
        parsed = model.model_validate(body)
    except ValidationError as err:
        raise BadRequestError(f"{model.__name__}: {err.errors(include_url=False)}") from err
    dumped: dict[str, Any] = parsed.model_dump(mode="json", exclude_none=True)
    return dumped


async def _json(request: Request, model: type[BaseModel]) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as err:
        raise BadRequestError(f"{request.url.path}: the body is not JSON") from err
    return _parse(model, body)


def _ttl(body: dict[str, Any]) -> dict[str, Any]:
    """A save request whose `ttl_seconds`, when given, is a positive whole number of seconds."""
    ttl = body.get("ttl_seconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
        raise BadRequestError(f"ttl_seconds={ttl!r}: a positive number of seconds, or none (kept until deleted)")
    return body


def _future(request_id: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"request_id": request_id, "model_id": model_id, **extra}


def add_routes(api: FastAPI, service: TinkerService) -> None:
    """Every route the pinned SDK calls, then the refusal of any other (last: it matches all)."""
    @api.exception_handler(TinkerServiceError)
    async def refused(request: Request, err: TinkerServiceError) -> JSONResponse:
        return JSONResponse(error_body(str(err), "invalid_request_error", err.code), status_code=err.status)

    _session_routes(api, service)
    _training_routes(api, service)
    _weight_routes(api, service)
    _sampling_routes(api, service)
    _future_routes(api, service)
    _refusal_routes(api, service)


def _session_routes(api: FastAPI, service: TinkerService) -> None:
    """Health, capabilities, the client config, sessions and heartbeats."""
    @api.get("/api/v1/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @api.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        return service.capabilities()

    @api.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return CLIENT_CONFIG

    @api.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {"sample_cancel_enabled": False}

    @api.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, Any]:
        return {"status": "accepted"}  # the SDK's usage events: accepted and dropped, nothing leaves

    @api.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        return service.create_session(await _json(request, types.CreateSessionRequest))

    @api.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        return service.heartbeat((await _json(request, types.SessionHeartbeatRequest))["session_id"])

    @api.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> Response:
        await service.finish_session(session_id)
        return Response(status_code=204)

    @api.get("/api/v1/sessions/{session_id}")
    async def session(session_id: str) -> dict[str, Any]:
        return service.session_info(session_id)

    @api.get("/api/v1/sessions")
    async def sessions() -> dict[str, Any]:
        return {"sessions": list(service.sessions)}


def _training_routes(api: FastAPI, service: TinkerService) -> None:
    """Training clients: create one, its info, forward_backward, optim_step."""
    @api.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        return _future(service.create_model(await _json(request, types.CreateModelRequest)))

    @api.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        return service.get_info((await _json(request, types.GetInfoRequest))["model_id"])

    @api.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        if request.headers.get("content-encoding"):
            raise NotServedError(f"Content-Encoding {request.headers['content-encoding']!r} on forward_backward")
        if PROTOBUF not in request.headers.get("content-type", ""):
            raise NotServedError("a JSON forward_backward body (the SDK sends protobuf)")
        parsed = decode_forward_backward(await request.body())
        return _future(service.forward_backward(parsed), parsed.model_id)

    @api.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        body = await _json(request, types.OptimStepRequest)
        return _future(service.optim_step(body), body["model_id"])


def _weight_routes(api: FastAPI, service: TinkerService) -> None:
    """Saving and loading weights, and listing training runs and checkpoints."""
    @api.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        body = _ttl(await _json(request, types.SaveWeightsRequest))
        return _future(service.save_weights(body), body["model_id"])

    @api.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        body = _ttl(await _json(request, types.SaveWeightsForSamplerRequest))
        return _future(service.save_for_sampler(body), body["model_id"])

    @api.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        body = await _json(request, types.LoadWeightsRequest)
        return _future(service.load_weights(body), body.get("model_id"))

    @api.post("/api/v1/weights_info")
    async def weights_info(request: Request) -> dict[str, Any]:
        body = await request.json()
        return service.weights_info(str(body.get("tinker_path", "")))

    @api.get("/api/v1/training_runs")
    async def training_runs(limit: int = 20, offset: int = 0) -> dict[str, Any]:
        return service.training_runs(limit, offset)

    @api.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str) -> dict[str, Any]:
        return service.training_run(model_id)

    @api.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str) -> dict[str, Any]:
        return service.checkpoints(model_id)

    @api.get("/api/v1/checkpoints")
    async def all_checkpoints() -> dict[str, Any]:
        return service.checkpoints()

    @api.delete("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str) -> Response:
        service.delete_checkpoint(model_id, checkpoint_id)
        return Response(status_code=204)


def _sampling_routes(api: FastAPI, service: TinkerService) -> None:
    """Sampling sessions and asample (on the local engine)."""
    @api.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        body = await _json(request, types.CreateSamplingSessionRequest)
        return {"type": "create_sampling_session", "sampling_session_id": await service.create_sampler(body)}

    @api.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        return service.sampler_info(sampler_id)

    @api.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        request_id, sequence_ids = service.sample(await _json(request, types.SampleRequest))
        return _future(request_id, sample_sequence_ids=sequence_ids)


def _future_routes(api: FastAPI, service: TinkerService) -> None:
    """retrieve_future: a result, a failure, or try_again after a long poll."""
    @api.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        request_id = (await _json(request, types.FutureRetrieveRequest))["request_id"]
        result = await service.futures.retrieve(request_id, service.settings.future_wait_s)
        if result is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if isinstance(result, Failure):
            return JSONResponse({"error": result.message, "category": result.category})
        if isinstance(result, bytes):
            return Response(result, media_type=PROTOBUF)
        return JSONResponse(result)


def _refusal_routes(api: FastAPI, service: TinkerService) -> None:
    """Any other /api/v1 path: a 400 naming it (registered last)."""
    @api.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def not_served(rest: str, request: Request) -> Response:
        raise NotServedError(f"{request.method} /api/v1/{rest}")
