"""The function workflow (`async def adder(task, model) -> float`) trains for one step through
`ajet.tune`, in this process; and its reward function scores replies as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture
def adder_module(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(HERE))
    import adder

    return adder


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_ajet_tune(tmp_path: Path, adder_module, one_step_overrides, read_run) -> None:
    import ajet

    ajet.tune(adder_module.adder, HERE / "adder.yaml",
              overrides=[*one_step_overrides, f"project.exp_dir={tmp_path}"])
    run = read_run(tmp_path / "adder")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    # The function's float is the episode reward: adder's scores are 0 or 1.
    assert 0.0 <= metrics["reward/mean"] <= 1.0
    assert metrics["context/calls"] == metrics["rollout/episodes"]  # one call per episode
    questions = {json.loads(line)["question"] for line in (HERE / "train.jsonl").read_text().splitlines()}
    records = run.records(1)
    assert records and {r["query"] for r in records} <= questions
    assert all(r["reward"] in (0.0, 1.0) for r in records)


def test_score(adder_module) -> None:
    score = adder_module.score
    assert score("13", "13") == 1.0
    assert score(" 13.", "13") == 1.0
    assert score("6 + 7 = 13", "13") == 1.0
    assert score("13, or maybe 12", "13") == 0.0
    assert score("113", "13") == 0.0
    assert score("twelve", "13") == 0.0


def test_splits_are_disjoint_and_test_holds_the_pairs_with_a_zero() -> None:
    def questions(split: str) -> set[str]:
        return {json.loads(line)["question"] for line in (HERE / f"{split}.jsonl").read_text().splitlines()}

    train, val, test = questions("train"), questions("val"), questions("test")
    assert len(train) + len(val) == 81 and not train & val
    assert len(test) == 19 and not test & (train | val)
    assert all(" 0 " in f" {q[8:-1]} " for q in test)  # "What is 0 + 7?": a 0 on one side at least
