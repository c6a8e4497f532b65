"""`Curriculum`: easy tasks first, then the whole train set (competence-based, as in
Platanios et al. 2019, "Competence-based Curriculum Learning").

A group-relative algorithm learns only from groups whose rewards differ. When the base model
never solves the hard tasks, a run that starts on them has no signal at all; a run that starts
on the tasks it sometimes solves learns the behaviour there first (here: calling the tool with
the right expression) and carries it to the harder ones as they enter the pool.

Each train task's `metadata[key]` is its difficulty (a number, lower = easier). Step `s`
(1-based) draws its batch uniformly from the easiest `pool_size(s)` tasks: `start` of the train
set at step 1, growing linearly to all of it at step `ramp_steps + 1`. Ties between equal
difficulties are broken by a seeded shuffle, so the pool is the same on every run of a seed.
Draws are seeded by their index, so a resumed run draws what an uninterrupted one would have.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from ajet.errors import CurriculumError
from ajet.workflow import WorkflowTask


class Curriculum:
    def __init__(self, tasks: Sequence[WorkflowTask], *, key: str, start: float, ramp_steps: int,
                 seed: int) -> None:
        if not 0 < start <= 1:
            raise CurriculumError(f"task_reader.curriculum.start={start} must be in (0, 1]")
        if ramp_steps < 1:
            raise CurriculumError(f"task_reader.curriculum.ramp_steps={ramp_steps} must be >= 1")
        self.key, self.start, self.ramp_steps, self.seed = key, start, ramp_steps, seed
        difficulty = [self._difficulty(task) for task in tasks]
        tie = list(range(len(tasks)))
        random.Random(f"ajet-{seed}-curriculum").shuffle(tie)
        # Easiest first; `tie[i]` orders tasks of equal difficulty.
        self.order = sorted(range(len(tasks)), key=lambda i: (difficulty[i], tie[i]))

    def _difficulty(self, task: WorkflowTask) -> float:
        value = task.metadata.get(self.key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise CurriculumError(
                f"task {task.task_id!r} has no numeric difficulty in its field {self.key!r} "
                f"(got {value!r}): task_reader.curriculum.key={self.key} needs a number in every "
                "train task (lower = easier); add the field to the data or set the key to '' (off)")
        return float(value)

    def pool_fraction(self, step: int) -> float:
        """The fraction of the train set (the easiest tasks) that step `step` draws from."""
        progress = min(1.0, max(0, step - 1) / self.ramp_steps)
        return self.start + (1 - self.start) * progress

    def pool_size(self, step: int) -> int:
        return max(1, min(len(self.order), math.ceil(self.pool_fraction(step) * len(self.order))))

    def draw(self, batch_size: int, step: int, draw_index: int) -> list[int]:
        """Indices of `batch_size` train tasks for `step`: distinct while the pool allows."""
        pool = self.order[: self.pool_size(step)]
        rng = random.Random(f"ajet-{self.seed}-curriculum-{draw_index}")
        picked: list[int] = []
        while len(picked) < batch_size:
            picked.extend(rng.sample(pool, min(len(pool), batch_size - len(picked))))
        return picked
