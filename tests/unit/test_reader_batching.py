"""TaskReader: endless deterministic epochs, resume from state_dict, val hold-out."""

from __future__ import annotations

import pytest

from ajet.task_reader import TaskReader, TaskReaderError, holdout_split
from ajet.workflow import WorkflowTask


def make_tasks(n: int) -> list[WorkflowTask]:
    return [WorkflowTask(task_id=f"t{i}", main_query=f"q{i}") for i in range(n)]


def ids(batch: list[WorkflowTask]) -> list[str]:
    return [t.task_id for t in batch]


def test_every_epoch_covers_each_task_once() -> None:
    reader = TaskReader(make_tasks(10), seed=3)
    epoch0 = ids(reader.next_batch(4) + reader.next_batch(4) + reader.next_batch(2))
    assert sorted(epoch0) == sorted(f"t{i}" for i in range(10))
    assert reader.epoch == 0
    epoch1 = ids(reader.next_batch(10))
    assert reader.epoch == 1
    assert sorted(epoch1) == sorted(epoch0)
    assert epoch1 != epoch0  # reshuffled per epoch (10! orders; equal only by a 1/3.6M chance)


def test_batch_spans_epoch_boundary_and_larger_than_dataset() -> None:
    reader = TaskReader(make_tasks(3), shuffle=False)
    assert ids(reader.next_batch(2)) == ["t0", "t1"]
    assert ids(reader.next_batch(2)) == ["t2", "t0"]
    assert ids(reader.next_batch(7)) == ["t1", "t2", "t0", "t1", "t2", "t0", "t1"]
    assert reader.epoch == 3


def test_same_seed_same_order_other_seed_differs() -> None:
    a = ids(TaskReader(make_tasks(20), seed=1).next_batch(40))
    b = ids(TaskReader(make_tasks(20), seed=1).next_batch(40))
    c = ids(TaskReader(make_tasks(20), seed=2).next_batch(40))
    assert a == b
    assert a != c


def test_resume_mid_epoch_gives_same_batches() -> None:
    uninterrupted = TaskReader(make_tasks(7), seed=5)
    expected = [ids(uninterrupted.next_batch(3)) for _ in range(6)]

    first = TaskReader(make_tasks(7), seed=5)
    got = [ids(first.next_batch(3)) for _ in range(2)]  # stops mid-epoch 0 (6 of 7)
    state = first.state_dict()
    resumed = TaskReader(make_tasks(7), seed=999)  # the saved seed is restored
    resumed.load_state_dict(state)
    got += [ids(resumed.next_batch(3)) for _ in range(4)]
    assert got == expected


def test_resume_with_changed_tasks_is_refused() -> None:
    state = TaskReader(make_tasks(5)).state_dict()
    with pytest.raises(TaskReaderError, match="train tasks changed"):
        TaskReader(make_tasks(6)).load_state_dict(state)


def test_holdout_is_deterministic_and_disjoint() -> None:
    tasks = make_tasks(20)
    train, val = holdout_split(tasks, 0.25, seed=7)
    assert len(val) == 5 and len(train) == 15
    assert not set(ids(train)) & set(ids(val))
    assert holdout_split(tasks, 0.25, seed=7) == (train, val)
    assert ids(holdout_split(tasks, 0.25, seed=8)[1]) != ids(val)
    # source order kept within each part
    assert ids(train) == sorted(ids(train), key=lambda s: int(s[1:]))


def test_holdout_keeps_at_least_one_and_rejects_all() -> None:
    assert len(holdout_split(make_tasks(3), 0.01, seed=0)[1]) == 1
    with pytest.raises(TaskReaderError, match="holds out all"):
        holdout_split(make_tasks(1), 0.5, seed=0)


def test_empty_train_set_is_an_error() -> None:
    with pytest.raises(TaskReaderError, match="no train tasks"):
        TaskReader([], source="x.jsonl")
