"""Curriculum: easy tasks first, a pool that grows to the whole train set, resumable draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ajet.backbones.registry import backbone_problems
from ajet.config.loader import load_config
from ajet.task_reader import TaskReader, build_reader
from ajet.task_reader.curriculum import Curriculum, CurriculumError
from ajet.workflow import WorkflowTask


def graded(n: int) -> list[WorkflowTask]:
    """Task i has difficulty i // 10: ten tasks of each level 0..n/10-1."""
    return [WorkflowTask(task_id=f"t{i}", main_query=f"q{i}", metadata={"level": i // 10}) for i in range(n)]


def levels(batch: list[WorkflowTask]) -> list[int]:
    return [t.metadata["level"] for t in batch]


def test_the_pool_starts_with_the_easiest_tasks_and_grows_to_all() -> None:
    cur = Curriculum(graded(40), key="level", start=0.25, ramp_steps=4, seed=0)
    reader = TaskReader(graded(40), seed=0, curriculum=cur)
    assert [cur.pool_size(s) for s in (1, 2, 3, 4, 5, 9)] == [10, 18, 25, 33, 40, 40]
    first = [t for _ in range(20) for t in reader.next_batch(4, step=1)]
    assert set(levels(first)) == {0}  # only the easiest quarter at step 1
    assert len({t.task_id for t in first}) == 10  # ... and all of it gets drawn
    late = [t for _ in range(40) for t in reader.next_batch(4, step=5)]
    assert set(levels(late)) == {0, 1, 2, 3}  # the whole set once the ramp is over


def test_a_batch_has_distinct_tasks_while_the_pool_allows() -> None:
    reader = TaskReader(graded(40), curriculum=Curriculum(graded(40), key="level", start=0.25,
                                                          ramp_steps=4, seed=0))
    batch = reader.next_batch(10, step=1)
    assert len({t.task_id for t in batch}) == 10
    bigger = reader.next_batch(12, step=1)  # larger than the 10-task pool: each task, then repeats
    assert len(bigger) == 12 and len({t.task_id for t in bigger}) == 10


def test_ties_are_broken_by_the_seed_and_draws_resume_exactly() -> None:
    tasks = [WorkflowTask(task_id=f"t{i}", main_query="q", metadata={"d": 1}) for i in range(30)]

    def reader(seed: int) -> TaskReader:
        return TaskReader(tasks, seed=seed, curriculum=Curriculum(tasks, key="d", start=0.2, ramp_steps=3,
                                                                  seed=seed))
    assert Curriculum(tasks, key="d", start=0.2, ramp_steps=3, seed=1).order != \
        Curriculum(tasks, key="d", start=0.2, ramp_steps=3, seed=2).order
    a = reader(1)
    draws = [[t.task_id for t in a.next_batch(3, step=s)] for s in (1, 2, 3)]
    b = reader(1)
    b.next_batch(3, step=1)
    state = b.state_dict()
    c = reader(1)
    c.load_state_dict(json.loads(json.dumps(state)))
    assert [[t.task_id for t in c.next_batch(3, step=s)] for s in (2, 3)] == draws[1:]


def test_a_task_without_a_numeric_difficulty_is_named() -> None:
    tasks = graded(3) + [WorkflowTask(task_id="odd", main_query="q", metadata={"level": "hard"})]
    with pytest.raises(CurriculumError, match=r"'odd'.*'level'.*'hard'"):
        Curriculum(tasks, key="level", start=0.5, ramp_steps=2, seed=0)
    with pytest.raises(CurriculumError, match=r"'t0'.*'size'"):
        Curriculum(graded(3), key="size", start=0.5, ramp_steps=2, seed=0)


def test_the_config_key_turns_it_on_and_gpu_backbones_refuse_it(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"q{i}", "answer": "1", "ops": i % 3})
                            + "\n" for i in range(12)))
    conf = tmp_path / "c.yaml"
    conf.write_text(f"task_reader:\n  jsonl: {{train_path: {data}}}\n  curriculum: {{key: ops, start: 0.33}}\n")
    cfg = load_config(conf, require_workflow=False)
    reader = build_reader(cfg.task_reader, seed=0)
    assert reader.curriculum is not None
    assert {t.metadata["ops"] for _ in range(10) for t in reader.next_batch(2, step=1)} == {0}
    assert [k for k, _ in backbone_problems("verl", cfg)] == ["task_reader.curriculum.key"]


def test_a_curriculum_reader_numbers_its_draws_for_the_serve_broker() -> None:
    """`ajet serve` with a curriculum (remote_agent.yaml): the broker takes each group's draw
    number from `last_draws`, which the curriculum's draws did not set (IndexError, a 500 to the
    client, a run that never trained)."""
    tasks = graded(40)
    reader = TaskReader(tasks, seed=0, curriculum=Curriculum(tasks, key="level", start=0.25, ramp_steps=4,
                                                               seed=0))
    reader.track_trained()
    reader.next_batch(1, step=1)
    first = reader.last_draws
    reader.next_batch(2, step=1)
    assert len(first) == 1 and len(reader.last_draws) == 2 and first[0] not in reader.last_draws
    reader.mark_trained(first + reader.last_draws, 1)
    state = reader.state_at_end_of(1)
    assert state["curriculum_draws"] == 2
