"""FailedSteps: stop a run whose every episode keeps failing, with the reason and a traceback.

A workflow that fails every episode (a client that gives up, a bug on the first line) trains
nothing, yet a run that only counted failures in its metrics went on to the end and exited
0. The trainer hands each step's episodes to `observe`; after `rollout.max_failed_steps`
consecutive steps in which every episode failed, it raises `AllEpisodesFailedError`, whose
message names the main failure reason and holds the first failed episode's error (its
traceback, for an exception). One ok episode resets the count. Plain data in, a decision
out: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ajet.errors import AllEpisodesFailedError
from ajet.rollout.episode import OK, Episode

__all__ = ["AllEpisodesFailedError", "FailedSteps"]


@dataclass
class FailedSteps:
    max_failed_steps: int  # 0 = never stop
    consecutive: int = 0
    first_step: int = 0  # the first step of the current streak
    first_failure: Episode | None = None
    reasons: Counter[str] = field(default_factory=Counter)

    def observe(self, step: int, episodes: Sequence[Episode]) -> None:
        """Count `step`; raise `AllEpisodesFailedError` when the streak reaches the limit."""
        if not episodes or any(e.status == OK for e in episodes):
            self.consecutive, self.first_failure = 0, None
            self.reasons.clear()
            return
        if self.consecutive == 0:
            self.first_step, self.first_failure = step, episodes[0]
        self.consecutive += 1
        self.reasons.update(e.reason or e.status for e in episodes)
        if self.max_failed_steps > 0 and self.consecutive >= self.max_failed_steps:
            raise AllEpisodesFailedError(self.message(step))

    def message(self, step: int) -> str:
        total = sum(self.reasons.values())
        (main, count), *others = self.reasons.most_common()
        also = "".join(f", {reason} ({n})" for reason, n in others)
        first = self.first_failure
        assert first is not None  # set with the first failed step of the streak
        detail = (first.error_message or first.reason).rstrip()
        return (
            f"every episode failed in {self.consecutive} consecutive steps "
            f"(steps {self.first_step}-{step}, {total} episodes), so nothing was trained. "
            f"Main reason: {main} ({count} of {total}){also}.\n"
            f"The first failed episode ({first.episode_id}, task {first.task.task_id!r}, "
            f"{first.reason or first.status}):\n{detail}\n"
            "Fix the workflow (try it on one task), or raise rollout.max_failed_steps "
            "(0 = never stop)."
        )
