"""Validation metrics over a rollout of the held-out tasks (RL and DPO recipes, evaluation)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ajet.rollout.agent_metrics import agent_metrics
from ajet.rollout.episode import Episode
from ajet.rollout.manager import RolloutResult, mean_log_metrics
from ajet.rollout.roles import role_metrics
from ajet.workflow import WorkflowTask

if TYPE_CHECKING:  # heavy at import (the loop: torch; the task readers: httpx, click); the callers have them
    from ajet.task_reader import TaskReader
    from ajet.training.loop import TrainingLoop

log = logging.getLogger(__name__)


class Rollout(Protocol):
    """A recipe's rollout of `tasks`, each `n` times (`RolloutManager.rollout`, run to completion)."""

    def __call__(self, tasks: list[WorkflowTask], n: int, *, episode_prefix: str) -> RolloutResult: ...


def validation_metrics(episodes: list[Episode], k: int) -> dict[str, float]:
    """Mean reward and success over all validation episodes, pass@k over tasks, the agent
    metrics (tool use; `ajet.rollout.agent_metrics`) under `val/agent/...`, and in a multi-agent
    run each role's (`ajet.rollout.roles.role_metrics`, over the ok episodes) under `val/role/...`,
    and the workflow's `log_metrics` means (over the ok episodes) under `val/workflow/...`.

    A failed episode counts as reward 0 and not successful (it is in the denominator)."""
    ok = [ep for ep in episodes if ep.status == "ok"]
    by_task: dict[str, list[bool]] = {}
    for ep in episodes:
        by_task.setdefault(ep.group_id, []).append(ep.status == "ok" and bool(ep.is_success))
    n = max(1, len(episodes))
    return {
        "val/reward/mean": sum(float(ep.reward) for ep in ok) / n,
        "val/success/rate": sum(1 for ep in ok if ep.is_success) / n,
        f"val/pass@{k}": sum(1 for v in by_task.values() if any(v)) / max(1, len(by_task)),
        "val/episodes": float(len(episodes)),
        "val/failed": float(len(episodes) - len(ok)),
        **{f"val/{key}": value for key, value in agent_metrics(episodes).items()},
        **{f"val/{key}": value for key, value in role_metrics(ok).items()},
        # the workflow's own behaviour metrics (log_metrics), over the ok episodes, as in training
        **{f"val/{key}": value for key, value in mean_log_metrics(ok, set()).items()
           if key.startswith("workflow/")},
    }


def validate_on_rollout(loop: TrainingLoop, reader: TaskReader, rollout: Rollout, k: int) -> dict[str, float]:
    """Roll out the reader's validation tasks `k` times each with `rollout(tasks, k, episode_prefix=)`
    and log `validation_metrics` at the loop's step; {} when there are no validation tasks."""
    tasks = reader.val_tasks()
    if not tasks:
        return {}
    loop.phase(f"validation: {len(tasks)} tasks × {k}")
    result = rollout(tasks, k, episode_prefix=f"val{loop.step}-")
    metrics = validation_metrics(result.episodes, k)
    loop.log(metrics, split="val")
    log.info("validation at step %d: %s", loop.step, "  ".join(f"{key} {value:.3f}" for key, value in metrics.items()))
    return metrics
