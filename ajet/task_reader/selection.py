"""Rollouts where they teach: the reader skips a train task that the current policy has lately
always or never solved (`task_reader.selection`), and revisits it later.

A group of a task whose episodes all pass, or all fail, has no reward variance: GRPO gives it no
gradient, and dynamic sampling drops it after it was paid for. The reader keeps, per task, the
pass rates of its last `window` groups (`observe`, after each step's rollout); a task with at
least `min_seen` of them, all 0 or all 1 (or only the one `pass_over` names), is passed over in
the epoch walk until `revisit_epochs` epochs after it was last drawn. The record is part of the
reader's state, so `--resume` draws what an uninterrupted run would have drawn.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ajet.config.schema import PassOver, TaskSelectionConfig


@dataclass(frozen=True)
class Outcome:
    """One episode of a task, as the selection sees it."""

    task_id: str
    passed: bool


class TaskSelection:
    """Which train tasks to pass over, from their recent pass rates."""

    def __init__(self, cfg: TaskSelectionConfig) -> None:
        self.cfg = cfg
        self._rates: dict[str, list[float]] = {}  # task id -> pass rates of its last `window` groups
        self._last_drawn: dict[str, int] = {}  # task id -> the epoch it was last drawn in
        self.skipped = 0  # tasks passed over since `take_skipped`

    def observe(self, outcomes: Iterable[Outcome]) -> None:
        """Record one step's episodes: each task's pass rate over its episodes of the step."""
        by_task: dict[str, list[bool]] = {}
        for outcome in outcomes:
            by_task.setdefault(outcome.task_id, []).append(outcome.passed)
        for task_id, passed in by_task.items():
            rates = self._rates.setdefault(task_id, [])
            rates.append(sum(passed) / len(passed))
            del rates[:-self.cfg.window]

    def passes_over(self, task_id: str, epoch: int) -> bool:
        """Whether the walk at `epoch` passes over `task_id` (settled, and not due for a revisit)."""
        if not self._settled(self._rates.get(task_id, [])) or epoch - self._last_drawn.get(task_id, epoch) >= self.cfg.revisit_epochs:
            return False
        self.skipped += 1
        return True

    def drawn(self, task_id: str, epoch: int) -> None:
        self._last_drawn[task_id] = epoch

    def take_skipped(self) -> int:
        """Tasks passed over since the last call (the step's `reader/selection_skipped`)."""
        skipped, self.skipped = self.skipped, 0
        return skipped

    def settled_share(self, num_tasks: int) -> float:
        """The share of train tasks that are settled now (all 0 or all 1 over `min_seen` groups, as
        `pass_over` counts them)."""
        settled = sum(1 for rates in self._rates.values() if self._settled(rates))
        return settled / num_tasks if num_tasks else 0.0

    def _settled(self, rates: list[float]) -> bool:
        """At least `min_seen` groups, all of them passed or all failed (`pass_over`: which of
        the two count)."""
        if len(rates) < self.cfg.min_seen:
            return False
        solved, failed = all(r == 1 for r in rates), all(r == 0 for r in rates)
        return {PassOver.both: solved or failed, PassOver.solved: solved, PassOver.failed: failed}[self.cfg.pass_over]

    def state_dict(self) -> dict[str, object]:
        return {"rates": {k: list(v) for k, v in self._rates.items()}, "last_drawn": dict(self._last_drawn)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        rates, last = state.get("rates", {}), state.get("last_drawn", {})
        if not isinstance(rates, dict) or not isinstance(last, dict):
            raise ValueError("the reader's saved task selection is malformed")
        self._rates = {str(k): [float(r) for r in v] for k, v in rates.items()}
        self._last_drawn = {str(k): int(v) for k, v in last.items()}
