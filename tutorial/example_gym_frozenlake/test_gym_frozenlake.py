"""Gymnasium's FrozenLake-v1 from a YAML alone trains for one step on the debug backbone: the
tasks come from the environment, the workflow is the adapter's, the turns of an episode merge
into one sample, and the environment's metrics reach metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytest.importorskip("gymnasium", reason="the envs extra: pip install 'ajet[envs]'")


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_from_the_yaml_alone(one_step) -> None:
    run = one_step(HERE / "gym_frozenlake.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    # The tiny random model names no move: every turn is an invalid move, until max_turns (8).
    assert metrics["workflow/turns"] == metrics["rollout/calls_per_episode"] == 8
    assert metrics["workflow/invalid_moves"] == 8 and metrics["workflow/return"] == 0.0
    assert metrics["context/samples"] == metrics["rollout/ok"]  # each episode's 8 calls: one sample
    records = run.records(1)
    assert len(records) == metrics["rollout/ok"]
    for r in records:
        assert len(r["segments"]) == 8 and all(all(r["loss_mask"][a:b]) for a, b in r["segments"])
        assert "[S]FFF" in "".join(r["tokens"])  # the env's own ansi render, the player in brackets
