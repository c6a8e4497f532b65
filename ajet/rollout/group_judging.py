"""Scoring a group's episodes together, once all of them have ended (judge.type=group_rank).

`RolloutManager.rollout` keeps one `GroupJudging` per rollout and awaits `score(episodes)` as
soon as a group's episodes are done (other groups may still be running). The episodes the
runner left pending (`ajet.rollout.scoring.score_episode`: the workflow returned no reward)
are shown to the judge together (`ajet.judge.group_rank`); its scores become their rewards and
they turn ok. When the judge fails (a reply unreadable twice, a failing endpoint, a timeout)
the whole group is dropped: its pending episodes fail as `group_judge:<why>` and are never
trained on. A group is never scored 0 for the judge's fault.

The judge's cost goes to the rollout's metrics (`metrics()`):

| metric | meaning |
|---|---|
| `judge/group_judged` | groups the judge scored |
| `judge/group_failures` | groups dropped because the judge failed |
| `judge/group_calls` | judge calls (a retry included) |
| `judge/group_retries` | replies that could not be read and were asked for again |
| `judge/group_prompt_tokens`, `judge/group_completion_tokens` | tokens of those calls, as the endpoint reports them |
| `judge/group_seconds` | seconds spent waiting for the judge, summed over groups |
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from ajet.judge.base import JudgeError
from ajet.judge.group_rank import GroupRankJudge, JudgeCost, UnreadableScores
from ajet.rollout.episode import FAILED, OK, PENDING, Episode

logger = logging.getLogger(__name__)


class GroupJudging:
    def __init__(self, judge: GroupRankJudge, timeout_s: float) -> None:
        """`timeout_s`: the most one group's judging may take, its retry included."""
        self.judge, self.timeout_s = judge, timeout_s
        self.cost = JudgeCost()
        self.judged = 0
        self.failed_groups: list[str] = []
        self.seconds = 0.0

    async def score(self, episodes: Sequence[Episode]) -> None:
        """Score the pending episodes of one group (in place), or fail them all."""
        pending = [e for e in episodes if e.status == PENDING]
        if not pending:
            return
        start = time.monotonic()
        try:
            scores = await asyncio.wait_for(
                self.judge.ascore_group(pending[0].task, [e.trajectory for e in pending], self.cost),
                timeout=self.timeout_s)
        except asyncio.TimeoutError:
            self._fail(pending, "timeout", f"the group judge ran longer than {self.timeout_s}s")
            return
        except UnreadableScores as exc:
            self._fail(pending, "unreadable", f"the group judge's reply could not be read: {exc}")
            return
        except JudgeError as exc:
            self._fail(pending, "call_error", str(exc))
            return
        finally:
            self.seconds += time.monotonic() - start
        self.judged += 1
        for episode, score in zip(pending, scores, strict=True):
            success = score >= self.judge.success_threshold
            episode.reward, episode.is_success, episode.status = score, success, OK
            if episode.output is not None:
                episode.output.reward, episode.output.is_success = score, success

    def metrics(self) -> dict[str, float]:
        cost = self.cost
        return {
            "judge/group_judged": float(self.judged),
            "judge/group_failures": float(len(self.failed_groups)),
            "judge/group_calls": float(cost.calls),
            "judge/group_retries": float(cost.retries),
            "judge/group_prompt_tokens": float(cost.prompt_tokens),
            "judge/group_completion_tokens": float(cost.completion_tokens),
            "judge/group_seconds": self.seconds,
        }

    def _fail(self, pending: list[Episode], why: str, message: str) -> None:
        group_id = pending[0].group_id
        self.failed_groups.append(group_id)
        for episode in pending:
            episode.status, episode.reason = FAILED, f"group_judge:{why}"
            episode.error_message = message
            episode.timelines = []  # a failed episode is never trained on
        logger.warning("group %s (%d episodes) dropped, the group judge failed: %s",
                       group_id, len(pending), message)
