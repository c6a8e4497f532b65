"""math_agent_group_rank.yaml: one training step through the real CLI with the group-ranking
judge on the policy (the tiny random model): every group is judged once or dropped, never
scored 0, and the judge's cost is logged."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_the_group_judge_on_the_policy(one_step) -> None:
    run = one_step(HERE / "math_agent_group_rank.yaml", "judge.group_rank.max_tokens=32")
    metrics = run.assert_completed()
    groups = metrics["rollout/episodes"] / 2  # ONE_STEP: rollout.n=2
    assert metrics["judge/group_judged"] + metrics["judge/group_failures"] == groups
    assert metrics["judge/group_calls"] >= groups and metrics["judge/group_prompt_tokens"] > 0
    # Only the judge fails episodes here; a group it could not score is out of the update.
    judge_failed = sum(v for k, v in metrics.items() if k.startswith("rollout/failed/group_judge:"))
    assert judge_failed == 2 * metrics["judge/group_failures"] == metrics["rollout/failed"]
    assert metrics["rollout/dropped_groups"] == metrics["judge/group_failures"]
