"""The episode API's wire: its request and answer models and the errors the broker raises
(each with its HTTP status and code). Below both `ajet.serve.http` (the routes, which translate
the errors into HTTP answers) and `ajet.serve.broker` (which raises them)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


# ----------------------------------------------------------------------------- errors
class EpisodeRequestError(Exception):
    """A request the episode API refuses (server side), with its HTTP status and code; the
    client raises `ajet.serve.client.EpisodeAPIError` for it."""

    status: int = 400
    code: str = "episode_error"
    retry_after_s: int | None = None


class EpisodeNotFoundError(EpisodeRequestError, KeyError):
    status, code = 404, "episode_not_found"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class EpisodeEndedError(EpisodeRequestError):
    """finish/abort of an episode that already ended (finished, aborted or timed out)."""

    status, code = 409, "episode_ended"


class NoEpisodeAvailableError(EpisodeRequestError):
    """Enough groups are open for the trainer's next steps; ask again shortly."""

    status, code, retry_after_s = 503, "no_episode_available", 1


class EpisodeKeyError(EpisodeRequestError):
    """finish/abort without the episode's own key (`X-Episode-Key`: the ticket's api_key)."""

    status, code = 403, "wrong_episode_key"


class ClientRewardRefusedError(EpisodeRequestError):
    """finish with a `reward` where the server's judge scores episodes (`serve.client_reward`)."""

    status, code = 400, "client_reward_refused"


class ReservedMetricError(EpisodeRequestError):
    """finish with a `log_metrics` key in a namespace of the server's (`judge/`, `sandbox/`)."""

    status, code = 400, "reserved_metric_name"


class RunEndedError(EpisodeRequestError):
    """The run is over (or shutting down): no more episodes."""

    status, code = 410, "run_ended"


# ----------------------------------------------------------------------------- wire models
class EpisodeTicket(BaseModel):
    """A new episode: solve `task`, calling the model at `base_url` with `api_key`."""

    episode_id: str
    task: dict[str, Any] = Field(description="task_id, main_query, init_messages, metadata, env_type")
    base_url: str = Field(description="OpenAI-compatible endpoint; every call with api_key is recorded")
    api_key: str = Field(description="valid until the episode finishes, aborts or times out")
    model: str = Field(description="any model name is accepted; this one is conventional")


_Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# A number, or {role: number} (per-role rewards; `ajet.workflow.Reward`, which this layer is below).
_Reward = Annotated[
    Annotated[_Finite, Tag("number")]
    | Annotated[dict[Annotated[str, Field(min_length=1)], _Finite], Field(min_length=1), Tag("roles")],
    Discriminator(lambda value: "roles" if isinstance(value, dict) else "number"),
]


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Finite and a real number: a NaN or "0.7" is answered 422, never trained on.
    reward: _Reward | None = Field(default=None, description=(
        "omit to let the configured judge score `metadata`; {role: reward} gives each role its own "
        "(a role the episode never registered fails it)"))
    is_success: bool | None = None
    metadata: dict[str, Any] = Field(
        default_factory=dict, description='what the judge reads, e.g. {"final_answer": "\\\\boxed{42}"}'
    )
    log_metrics: dict[str, float] = Field(default_factory=dict, description="scalars averaged and logged per step")


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=2000)


class EpisodeResult(BaseModel):
    """How an episode ended: status ok / failed / timeout, the reward (ok only), the reason."""

    episode_id: str
    status: str
    reward: float | None = None  # with per-role rewards, their mean
    role_rewards: dict[str, float] | None = None  # ok episodes finished with {role: reward}
    is_success: bool | None = None
    reason: str = ""
    # Why a finished episode was not ok, for the client to act on (e.g. a per-role reward naming
    # a role the episode never registered: the role and the fix).
    detail: str = ""


class ServerStatus(BaseModel):
    step: int = Field(description="the last step the trainer asked episodes for (0 before the first)")
    policy_version: int
    episodes_running: int = Field(description="handed out, not yet ended")
    episodes_waiting: int = Field(description="ended, in groups the trainer has not taken yet")
    episodes_finished: int = Field(description="finished by their clients since the start")
    episodes_aborted: int
    episodes_timed_out: int
    episodes_dropped_stale: int
    groups_ready: int = Field(description="complete groups waiting for the trainer")
    closed: bool
    last_metrics: dict[str, float] = Field(default_factory=dict)
