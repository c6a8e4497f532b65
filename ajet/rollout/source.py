"""Where a training step's episodes come from: one protocol, one class per source.

A recipe asks `source.next_batch(step)` and gets a `RolloutResult` (its `ok_episodes` are what
it trains on, `extra_metrics` what the source itself measured); it never asks which source it
has. The sources:

- `ManagedEpisodes`: the step's tasks from the task reader, run `rollout.n` times by a rollout
  manager: the in-process `RolloutManager`, or the Ray builder's manager (`--with-ray`);
- `RefilledEpisodes`: the same, with dynamic sampling: groups without a learning signal are
  dropped and refilled with more tasks (`ajet.rollout.dynamic`);
- `ServedEpisodes` (`ajet.serve.source`): episodes that clients run elsewhere, through the
  episode API of `ajet serve`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from ajet.config.schema import RolloutConfig
from ajet.rollout.dynamic import sample_with_signal
from ajet.rollout.manager import RolloutManager, RolloutResult
from ajet.task_reader import TaskReader
from ajet.workflow import WorkflowTask

Phase = Callable[[str], object]  # shows what the step is doing (the progress line)


class EpisodeSource(Protocol):
    # Whether episodes may be generated while the trainer updates (the step's tokens per second
    # then count the time since the previous batch arrived, not only the wait).
    overlaps_update: bool

    async def next_batch(self, step: int) -> RolloutResult:
        """The episodes of training step `step`."""

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """The step's metrics once it is done (the served source shows them to its clients)."""

    def close(self) -> None:
        """Stop what the source started (nothing, for most)."""


class ManagedEpisodes:
    """`batch_size` tasks of the reader, each rolled out `rollout.n` times by `manager`."""

    overlaps_update = False

    def __init__(self, manager: RolloutManager, reader: TaskReader, rollout: RolloutConfig, *, batch_size: int,
                 phase: Phase = lambda text: None) -> None:
        self.manager, self.reader, self.rollout = manager, reader, rollout
        self.batch_size, self.phase = batch_size, phase

    async def next_batch(self, step: int) -> RolloutResult:
        tasks = self.reader.next_batch(self.batch_size, step=step)
        self.phase(f"step {step}: rollout of {len(tasks)} tasks × {self.rollout.n}")
        result = await self.manager.rollout(tasks, self.rollout.n, episode_prefix=f"s{step}-")
        curriculum_metrics(self.reader, step, result)
        return result

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class RefilledEpisodes(ManagedEpisodes):
    """Dynamic sampling: up to `rollout.dynamic_sampling.max_rounds` rounds until `batch_size`
    groups have unequal rewards (their `dynamic/*` metrics go to `extra_metrics`)."""

    async def next_batch(self, step: int) -> RolloutResult:
        n = self.rollout.n

        async def one_round(tasks: list[WorkflowTask], index: int) -> RolloutResult:
            self.phase(f"step {step}: rollout round {index + 1} of {len(tasks)} tasks × {n}")
            prefix = f"s{step}-" if index == 0 else f"s{step}r{index}-"
            return await self.manager.rollout(tasks, n, episode_prefix=prefix)

        result, metrics = await sample_with_signal(
            one_round, functools.partial(self.reader.next_batch, step=step), batch_size=self.batch_size,
            max_rounds=self.rollout.dynamic_sampling.max_rounds)
        result.extra_metrics.update(metrics)
        curriculum_metrics(self.reader, step, result)
        return result


def managed_episodes(manager: RolloutManager, reader: TaskReader, rollout: RolloutConfig, *, batch_size: int,
                     phase: Phase = lambda text: None) -> ManagedEpisodes:
    """The reader-and-manager source the config asks for (with or without dynamic sampling)."""
    cls = RefilledEpisodes if rollout.dynamic_sampling.enabled else ManagedEpisodes
    return cls(manager, reader, rollout, batch_size=batch_size, phase=phase)


def curriculum_metrics(reader: TaskReader, step: int, result: RolloutResult) -> None:
    """`data/curriculum_pool` of step `step` into `result`, when the reader has a curriculum."""
    if reader.curriculum is not None:
        result.extra_metrics["data/curriculum_pool"] = reader.curriculum.pool_fraction(step)
