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



@pytest.fixture
def make_demos(monkeypatch: pytest.MonkeyPatch):
    """make_demos.py, imported under a name of its own; the modules it imports (countdown) are
    removed afterwards: other tutorials import their own make_demos / make_data by those names."""
    import importlib.util
    import sys

    monkeypatch.syspath_prepend(str(HERE))
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("countdown_make_demos", HERE / "make_demos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_demos_are_the_train_solutions_in_the_workflows_messages(make_demos) -> None:
    """demos.jsonl is what make_demos.py makes: one dialog per train puzzle (none of val or test),
    the workflow's own messages answered with the stored solution, which the judge scores 1."""
    import json

    from ajet.judge.countdown import CountdownJudge
    from ajet.task_reader.jsonl import read_jsonl_tasks
    from ajet.workflow import WorkflowOutput

    train = [json.loads(line) for line in (HERE / "train.jsonl").read_text().splitlines()]
    shipped = (HERE / "demos.jsonl").read_text()
    assert shipped == "".join(json.dumps(make_demos.demo(r)) + "\n" for r in train)
    held_out = {t.main_query for split in ("val", "test") for t in read_jsonl_tasks(HERE / f"{split}.jsonl")[0]}
    judge = CountdownJudge()
    tasks = {t.task_id: t for t in read_jsonl_tasks(HERE / "train.jsonl")[0]}
    for line in shipped.splitlines():
        demo = json.loads(line)
        system, user, reply = (m["content"] for m in demo["messages"])
        task = tasks[demo["id"].removeprefix("countdown-")]
        assert task.main_query not in held_out
        assert user == f"Numbers: {task.metadata['numbers']}. Target: {task.metadata['target']}."
        assert judge.compute_reward(task, WorkflowOutput(metadata={"final_answer": reply})) == (1.0, True)
