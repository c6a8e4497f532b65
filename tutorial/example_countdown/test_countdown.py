"""Countdown trains for one step on the debug backbone, scored by the countdown judge; every
shipped puzzle is solvable (its stored solution scores 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step(one_step) -> None:
    run = one_step(HERE / "countdown.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0  # the judge scored every episode
    assert metrics["context/calls"] == metrics["rollout/episodes"]  # one call per episode
    assert "workflow/answer_tag" in metrics
    records = run.records(1)
    assert records
    # The judge's three levels: 1 (solved), format_score 0.1 (well-formed miss), 0.
    assert all(r["reward"] in (0.0, 0.1, 1.0) for r in records)


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_shipped_puzzles_are_solvable(split: str) -> None:
    from ajet.judge.countdown import CountdownJudge
    from ajet.task_reader.jsonl import read_jsonl_tasks
    from ajet.workflow import WorkflowOutput

    judge = CountdownJudge(use_all_numbers=True)
    tasks, skipped = read_jsonl_tasks(HERE / f"{split}.jsonl")
    assert skipped == 0 and len(tasks) >= 20
    for task in tasks:
        answer = f"<answer>{task.metadata['solution']}</answer>"
        assert judge.compute_reward(task, WorkflowOutput(metadata={"final_answer": answer})) == (1.0, True)
        assert judge.compute_reward(task, WorkflowOutput(metadata={"final_answer": "<answer>1+</answer>"})) == (0.0, False)

