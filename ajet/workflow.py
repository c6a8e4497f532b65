"""The user-facing workflow API: subclass `Workflow`, return a `WorkflowOutput`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
)

if TYPE_CHECKING:  # pragma: no cover
    from ajet.tuner import ModelTuner


class WorkflowTask(BaseModel):
    """One task handed to `Workflow.execute`."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    main_query: str = ""
    init_messages: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    env_type: str = ""


def _numpy_bool(value: Any) -> Any:
    """`numpy.bool_` (what `np.isclose` and friends return) as a bool; anything else as is,
    so the strict check still rejects 1, "yes" and the like."""
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    return value


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _reward_kind(value: Any) -> str:
    """Which form a reward takes: one number for the episode, or a dict of one per role."""
    return "roles" if isinstance(value, dict) else "number"


# One finite number, or {role: finite number} (at least one role, names non-empty). The
# discriminator validates only the form given, so an error names the role that is wrong
# (`reward.roles.wolf='1' (str)`) instead of also complaining that a dict is not a number.
Reward = Annotated[
    Annotated[FiniteFloat, Tag("number")]
    | Annotated[dict[Annotated[str, Field(min_length=1)], FiniteFloat], Field(min_length=1), Tag("roles")],
    Discriminator(_reward_kind),
]


class WorkflowOutput(BaseModel):
    """What an episode produced. `reward=None` lets the configured judge compute it.

    Types are strict: a reward is a finite number (int, float or a NumPy scalar), never a
    string or a bool, so `reward="0.7"` is an error rather than a silent 0.7. `log_metrics`
    values are numbers too; a NaN/inf among them is dropped from the step's means and
    counted in `rollout/dropped_log_metrics` (it is a metric, not the training signal).

    Several trained roles (multi-agent, self-play): `reward={"wolf": 1.0, "villager": 0.0}`
    gives each role its own reward. Each role's samples then get their advantage from that
    role's rewards across the group's episodes (GRPO groups per task and role), and the
    episode's single reward (`Episode.reward`: metrics, dynamic sampling, validation) is the
    mean over the roles. Every role named must have been registered in the episode (a call
    by it, `tuner.register_model`, or `trainable_targets`), and every role whose calls are
    trained must have a reward; see docs/multi_agent.md.
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    reward: Reward | None = None
    is_success: Annotated[bool | None, BeforeValidator(_numpy_bool)] = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Scalars averaged over the step and logged (e.g. {"turns": 3}).
    log_metrics: dict[str, float] = Field(default_factory=dict)
    # Optional per-LLM-call rewards (in call order), used by per-step algorithms.
    step_rewards: list[Annotated[float, Field(allow_inf_nan=False)]] | None = None
    # Optional per-LLM-call environment states (in call order; None = not marked): the state each
    # call acted in, e.g. the agent's position on a map. With algorithm.step_credit=gigpo, the
    # steps of one task's rollouts that share a state are compared (docs/credit.md). A key must
    # name the state fully: two steps with the same key are treated as the same situation.
    step_states: list[str | None] | None = None


class Workflow(BaseModel):
    """Subclass and implement `execute`. `trainable_targets`: roles trained (None/empty = all)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")

    name: str = "workflow"
    trainable_targets: ClassVar[list[str] | None] = None

    async def execute(self, task: WorkflowTask, tuner: ModelTuner) -> WorkflowOutput:
        raise NotImplementedError(f"{type(self).__name__}.execute(task, tuner) is not implemented")


def describe_output_error(exc: ValidationError) -> str:
    """A `WorkflowOutput` validation error as one line that names each field and value,
    e.g. `reward='high' (str): Input should be a valid number`."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        if loc[:1] == ["reward"] and loc[1:2] in (["number"], ["roles"]):
            del loc[1]  # the tag of the reward's form (`Reward`), not a field: reward.wolf='1'
        field = ".".join(str(p) for p in loc) or "(output)"
        value = err.get("input")
        parts.append(f"{field}={value!r:.80} ({type(value).__name__}): {err['msg']}")
    return "; ".join(parts)
