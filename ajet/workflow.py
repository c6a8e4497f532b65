"""The user-facing workflow API: subclass `Workflow`, return a `WorkflowOutput`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

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


class WorkflowOutput(BaseModel):
    """What an episode produced. `reward=None` lets the configured judge compute it."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None = None
    is_success: bool | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Scalars averaged over the step and logged (e.g. {"turns": 3}).
    log_metrics: dict[str, float] = Field(default_factory=dict)
    # Optional per-LLM-call rewards (in call order), used by per-step algorithms.
    step_rewards: list[float] | None = None


class Workflow(BaseModel):
    """Subclass and implement `execute`. `trainable_targets`: roles trained (None/empty = all)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")

    name: str = "workflow"
    trainable_targets: ClassVar[list[str] | None] = None

    async def execute(self, task: WorkflowTask, tuner: ModelTuner) -> WorkflowOutput:
        raise NotImplementedError(f"{type(self).__name__}.execute(task, tuner) is not implemented")
