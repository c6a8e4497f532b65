"""The episode API's HTTP layer: agents outside Python (or outside this process) train the model.

Mounted on the gateway (`attach_episode_api`) next to the OpenAI-compatible model routes:

    POST /v1/episodes                  -> {episode_id, task, base_url, api_key, model}
    POST /v1/episodes/{id}/finish      {reward?, is_success?, metadata?, log_metrics?}
    POST /v1/episodes/{id}/abort       {reason}
    GET  /v1/status                    step, policy version, episode counts, last metrics

A server-level client token (`Authorization: Bearer <token>`) guards these routes (and /docs,
/openapi.json), checked before a body is read (`ajet.tuner.http_guard`); the per-episode
`api_key` guards the model calls, as for in-process workflows, and ending the episode: finish
and abort carry it in `X-Episode-Key`, so a client cannot end another's episode. The routes only
translate HTTP: the broker behind them (`ajet.serve.broker.EpisodeBroker`) hands out tasks,
scores and collects episodes; the wire models and the errors it raises are
`ajet.serve.protocol`'s. (FastAPI is imported at the top: it resolves the routes' string
annotations against this module's names, the wire models imported here among them.)
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException

from ajet.serve.protocol import (
    AbortRequest,
    EpisodeRequestError,
    EpisodeResult,
    EpisodeTicket,
    FinishRequest,
    ServerStatus,
)

if TYPE_CHECKING:  # pragma: no cover
    from ajet.serve.broker import EpisodeBroker
    from ajet.tuner.gateway import Gateway

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- routes
# Only the client that began an episode may end it: finish and abort carry its api_key.
EpisodeKey = Annotated[str, Header(alias="X-Episode-Key", description="the episode's api_key (from its ticket)")]


def episode_router(broker: EpisodeBroker) -> Any:
    """The FastAPI router of the episode API, guarded by the client `token`."""
    bearer = HTTPBearer(auto_error=False, scheme_name="client_token",
                        description="the server's client token (not a per-episode api_key)")

    # The token and the body cap are checked in front of the app, before a body is read
    # (`ajet.tuner.http_guard`, set up by `attach_episode_api`); the dependency declares the
    # scheme for /docs.
    router = APIRouter(prefix="/v1", tags=["episodes"], dependencies=[Depends(bearer)])
    errors: dict[int | str, dict[str, Any]] = {401: {"description": "missing or wrong client token"}}

    @router.post("/episodes", response_model=EpisodeTicket, responses={
        **errors, 410: {"description": "the run has ended"},
        503: {"description": "no episode available yet (enough groups open); retry after Retry-After"}})
    async def begin_episode(request: Request) -> EpisodeTicket:
        """Begin an episode: the next task (each task is handed out `rollout.n` times, one GRPO
        group), and a per-episode key for the model endpoint."""
        ticket = await _guard(broker.begin())
        # The model endpoint is this server: give it as the client reached it (the gateway may
        # listen on 0.0.0.0 and be reached through any name).
        return ticket.model_copy(update={"base_url": str(request.base_url).rstrip("/") + "/v1"})

    ended = {**errors, 403: {"description": "X-Episode-Key is not this episode's api_key"},
             404: {"description": "unknown episode"},
             409: {"description": "the episode already ended (finished, aborted or timed out)"}}

    @router.post("/episodes/{episode_id}/finish", response_model=EpisodeResult, responses=ended)
    async def finish_episode(episode_id: str, body: FinishRequest, key: EpisodeKey = "") -> EpisodeResult:
        """Finish an episode. Without `reward`, the configured judge scores it from `metadata`
        (as a workflow returning `WorkflowOutput(reward=None)`). Its api_key stops working."""
        return await _guard(broker.finish(episode_id, key, body))

    @router.post("/episodes/{episode_id}/abort", response_model=EpisodeResult, responses=ended)
    async def abort_episode(episode_id: str, body: AbortRequest, key: EpisodeKey = "") -> EpisodeResult:
        """Abort an episode: counted as failed (`rollout/failed/aborted`), never trained on."""
        return await _guard(broker.abort(episode_id, key, body.reason))

    @router.get("/status", response_model=ServerStatus, responses=errors)
    async def status() -> ServerStatus:
        """The step, the policy version, episode counts and the trainer's last metrics."""
        return await _guard(broker.status())

    return router


async def _guard(call: Any) -> Any:
    try:
        return await call
    except EpisodeRequestError as err:
        headers = {"Retry-After": str(err.retry_after_s)} if err.retry_after_s else None
        raise _http(err.status, str(err), err.code, headers) from err


def _http(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> Exception:
    exc = HTTPException(status, message, headers)
    exc.code = code  # type: ignore[attr-defined]  # read by the gateway's error handler
    return exc


def attach_episode_api(gateway: Gateway, broker: EpisodeBroker, token: str | None = None) -> str:
    """Serve the episode API (and /docs, /openapi.json) on `gateway`; returns the client token
    (`token`, or a new random one when None or empty)."""
    token = token or secrets.token_urlsafe(24)
    gateway.require_client_token(token)
    gateway.include_router(episode_router(broker))
    if gateway.running:
        log.info("episode API on %s/episodes (docs at %s/docs)", gateway.base_url,
                 gateway.base_url.removesuffix("/v1"))
    return token
