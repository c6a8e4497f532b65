"""The user-facing workflow API: subclass `Workflow`, return a `WorkflowOutput`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

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


class WorkflowOutput(BaseModel):
    """What an episode produced. `reward=None` lets the configured judge compute it.

    Types are strict: a reward is a finite number (int, float or a NumPy scalar), never a
    string or a bool, so `reward="0.7"` is an error rather than a silent 0.7. `log_metrics`
    values are numbers too; a NaN/inf among them is dropped from the step's means and
    counted in `rollout/dropped_log_metrics` (it is a metric, not the training signal).
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    reward: float | None = Field(default=None, allow_inf_nan=False)
    is_success: Annotated[bool | None, BeforeValidator(_numpy_bool)] = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Scalars averaged over the step and logged (e.g. {"turns": 3}).
    log_metrics: dict[str, float] = Field(default_factory=dict)
    # Optional per-LLM-call rewards (in call order), used by per-step algorithms.
    step_rewards: list[Annotated[float, Field(allow_inf_nan=False)]] | None = None


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
        field = ".".join(str(p) for p in err["loc"]) or "(output)"
        value = err.get("input")
        parts.append(f"{field}={value!r:.80} ({type(value).__name__}): {err['msg']}")
    return "; ".join(parts)
