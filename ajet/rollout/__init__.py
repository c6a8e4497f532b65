"""The rollout side shared by every backbone: load the workflow, run episodes, summarise a step.

- `load_workflow(target)` / `as_workflow(obj)`: a `Workflow` from a config target, a class,
  an instance or an `async def fn(task: dict, model) -> float` (checked before anything loads).
- `TaskRunner.run_episode`: one episode, every ending recorded as an `Episode`.
- `RolloutManager.rollout`: tasks × n episodes, bounded concurrency, `RolloutResult.metrics()`.
- `EngineRollout` (`ajet.rollout.engine_rollout`): all of it built around an inference engine.
- `ajet.serve.broker.EpisodeBroker.next_batch`: the same `RolloutResult`, from episodes that
  clients run through the episode API (`ajet serve`).
"""

from ajet.errors import BadOutputError, InfrastructureError
from ajet.rollout.episode import Episode
from ajet.rollout.manager import RolloutManager, RolloutResult, drop_equal_reward_groups
from ajet.rollout.runner import EpisodeHandle, SessionFactory, TaskRunner
from ajet.rollout.workflow_loader import (
    FunctionWorkflow,
    WorkflowLoadError,
    WorkflowSignatureError,
    as_workflow,
    load_workflow,
    validate_workflow_function,
)

__all__ = [
    "BadOutputError",
    "Episode",
    "EpisodeHandle",
    "FunctionWorkflow",
    "InfrastructureError",
    "RolloutManager",
    "RolloutResult",
    "SessionFactory",
    "TaskRunner",
    "WorkflowLoadError",
    "WorkflowSignatureError",
    "as_workflow",
    "drop_equal_reward_groups",
    "load_workflow",
    "validate_workflow_function",
]
