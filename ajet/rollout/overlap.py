"""One-step off-policy overlap (`rollout.max_staleness > 0`): the next step's episodes roll out
while the trainer updates the weights.

`OverlappedEpisodes` wraps any managed episode source. The recipe calls `prefetch(step + 1)` as it
starts step `step`'s update (which then runs off the event loop's thread, so the loop keeps
running the prefetched episodes); `next_batch(step + 1)` then awaits what was prefetched
instead of starting from nothing. The engine decodes those episodes with its own copy of the
weights of the step before (`rollout.engine_dtype` float16 / bfloat16), which the trainer
replaces once the update is done (`LocalEngine.publish_weights`).

What the trainer gets is filtered by staleness (`ajet.rollout.staleness`, the rule `ajet
serve` applies too): an episode more than `max_staleness` policy versions behind is not
trained on (`rollout/failed/stale`) and leaves its group. The rest are trained with the TIS
correction (`algorithm.tis_cap`): each token's loss weighted by min(p_trainer / p_sampled, cap).
Metrics: the staleness ones, and `rollout/prefetched` (1 when the step's episodes were started
during the previous update).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ajet.rollout.manager import RolloutResult
from ajet.rollout.staleness import keep_fresh


class OverlappedEpisodes:
    """An episode source whose next batch can start early (see the module docstring)."""

    overlaps_update = True

    def __init__(self, inner: Any, *, max_staleness: int, version: Callable[[], int]) -> None:
        if max_staleness < 1:
            raise ValueError(f"max_staleness={max_staleness}: the overlap needs at least 1 (0 is on-policy)")
        self.inner = inner
        self.max_staleness = max_staleness
        self.version = version
        self._ahead: tuple[int, asyncio.Task] | None = None

    def prefetch(self, step: int) -> None:
        """Start `step`'s rollout now, on the running event loop (call it from a coroutine)."""
        if self._ahead is not None and self._ahead[0] == step:
            return
        self._cancel()
        self._ahead = (step, asyncio.ensure_future(self.inner.next_batch(step)))

    async def next_batch(self, step: int) -> RolloutResult:
        prefetched = self._ahead is not None and self._ahead[0] == step
        if prefetched:
            assert self._ahead is not None
            task, self._ahead = self._ahead[1], None
            result = await task
        else:
            self._cancel()
            result = await self.inner.next_batch(step)
        keep_fresh(result, self.version(), self.max_staleness)
        result.extra_metrics["rollout/prefetched"] = float(prefetched)
        return result

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.inner.record_metrics(step, metrics)

    def close(self) -> None:
        self._cancel()
        self.inner.close()

    def _cancel(self) -> None:
        """Drop a prefetch that will not be asked for (a step it was not started for, or the end)."""
        if self._ahead is None:
            return
        task, self._ahead = self._ahead[1], None
        if task.done():
            return
        task.cancel()
        loop = task.get_loop()
        if not loop.is_running() and not loop.is_closed():
            loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
