"""Online continual learning: reservoir buffer, replay at the configured ratio, planned batches."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from ajet.sft.replay import ReservoirBuffer, mix_round, replay_count
from ajet.sft.schedule import mixture, plan_batches, split_rounds


def test_replay_count_makes_the_ratio() -> None:
    assert replay_count(80, 0.2) == 20  # 20 / (80 + 20) = 0.2
    assert replay_count(30, 0.5) == 30
    assert replay_count(10, 0.0) == 0
    with pytest.raises(ValueError, match="ratio"):
        replay_count(10, 1.0)


def test_mix_round_replays_ratio_of_the_round_from_the_buffer() -> None:
    buffer: ReservoirBuffer[str] = ReservoirBuffer(50, seed=0)
    buffer.extend(f"old{i}" for i in range(200))
    new = [f"new{i}" for i in range(80)]
    mixed = mix_round(new, buffer, 0.2, random.Random(1))
    replayed = [x for x in mixed if x.startswith("old")]
    assert mixed[:80] == new and len(mixed) == 100
    assert len(replayed) / len(mixed) == 0.2
    assert len(set(replayed)) == 20 and set(replayed) <= set(buffer.items)
    # a short buffer gives what it has
    small: ReservoirBuffer[str] = ReservoirBuffer(5, seed=0)
    small.extend(["a", "b"])
    assert sorted(mix_round(new, small, 0.5, random.Random(0))[80:]) == ["a", "b"]


def test_reservoir_keeps_capacity_and_is_uniform() -> None:
    buffer: ReservoirBuffer[int] = ReservoirBuffer(10, seed=0)
    buffer.extend(range(10))
    assert buffer.items == list(range(10))  # fills in order first
    buffer.extend(range(10, 1000))
    assert len(buffer) == 10 and buffer.seen == 1000
    counts: Counter[int] = Counter()
    trials = 2000
    for seed in range(trials):
        b: ReservoirBuffer[int] = ReservoirBuffer(10, seed=seed)
        b.extend(range(100))
        counts.update(b.items)
    # each item is kept with probability 10/100: expected 200 of 2000 trials, sd ~13
    assert all(130 < counts[i] < 270 for i in range(100)), (min(counts.values()), max(counts.values()))
    early = sum(counts[i] for i in range(50)) / (10 * trials)
    assert 0.45 < early < 0.55  # early and late items are equally likely


def test_reservoir_is_seeded_and_resumable() -> None:
    a: ReservoirBuffer[int] = ReservoirBuffer(5, seed=3)
    a.extend(range(40))
    b: ReservoirBuffer[int] = ReservoirBuffer(5, seed=99)
    b.load_state_dict(a.state_dict())
    a.extend(range(40, 80))
    b.extend(range(40, 80))
    assert a.items == b.items
    c: ReservoirBuffer[int] = ReservoirBuffer(5, seed=3)
    c.extend(range(80))
    assert c.items == a.items


def test_mixture_weights_per_task_type() -> None:
    types = ["a"] * 4 + ["b"] * 6 + ["c"] * 3 + ["d"] * 2
    out = mixture(list(range(15)), types, {"a": 2.0, "b": 0.5, "c": 0.0}, random.Random(0))
    counts = Counter(types[i] for i in out)
    assert counts == {"a": 8, "b": 3, "d": 2}  # 2x, half (round(0.5 * 6)), dropped, default 1
    assert Counter(i for i in out if types[i] == "a") == {i: 2 for i in range(4)}
    assert len({i for i in out if types[i] == "b"}) == 3  # a subsample without repeats


def test_split_rounds_consecutive_chunks() -> None:
    assert split_rounds(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_rounds([4, 2], 1) == [[4, 2]]


def test_plan_batches_rounds_replay_and_batches() -> None:
    order = list(range(40))
    types = ["t"] * 40
    plan = plan_batches(order, types, rounds=2, epochs=2, batch_size=8, task_weights={},
                        replay_size=100, replay_ratio=0.5, seed=0)
    by_round = {r: [i for b in plan if b.round == r for i in b.indices] for r in (0, 1)}
    # round 0: its 20 dialogs, nothing to replay yet; x2 epochs
    assert Counter(by_round[0]) == {i: 2 for i in range(20)}
    # round 1: its 20 new dialogs + 20 replayed from round 0 (ratio 0.5), the same set both epochs
    new = [i for i in by_round[1] if i >= 20]
    old = [i for i in by_round[1] if i < 20]
    assert Counter(new) == {i: 2 for i in range(20, 40)} and len(old) == 40
    assert len(set(old)) == 20 and all(v == 2 for v in Counter(old).values())
    epochs = [(b.round, b.epoch) for b in plan]
    assert epochs == sorted(epochs)  # rounds and epochs in order
    # an epoch is cut into batches of 8; round 0's epochs (20 dialogs) end with a batch of 4
    assert [len(b.indices) for b in plan] == [8, 8, 4] * 2 + [8] * 10
    assert plan == plan_batches(order, types, rounds=2, epochs=2, batch_size=8, task_weights={},
                                replay_size=100, replay_ratio=0.5, seed=0)


def test_plan_last_batch_of_an_epoch_is_smaller_and_no_replay_without_buffer() -> None:
    plan = plan_batches(list(range(10)), ["t"] * 10, rounds=1, epochs=1, batch_size=4,
                        task_weights={}, replay_size=0, replay_ratio=0.0, seed=1)
    assert [len(b.indices) for b in plan] == [4, 4, 2]
    assert sorted(i for b in plan for i in b.indices) == list(range(10))
    other = plan_batches(list(range(10)), ["t"] * 10, rounds=1, epochs=1, batch_size=4,
                         task_weights={}, replay_size=0, replay_ratio=0.0, seed=2)
    assert other != plan  # the shuffle follows the seed
