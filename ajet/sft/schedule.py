"""The SFT schedule: which dialogs each optimizer step trains on. Pure and seeded.

Planned whole before training, so the LR schedule knows the step count and a resumed
run replays exactly the batches an uninterrupted run would have drawn.

- rounds: the (coreset-selected) dialogs arrive in `rounds` consecutive chunks;
- replay: each round adds dialogs replayed from a reservoir of earlier rounds
  (`ajet.sft.replay`), then its own dialogs enter the reservoir;
- mixture: within a round's epoch, each task type appears `weight` times: `floor(weight)`
  full copies plus a seeded subsample of `round(frac(weight) * count)` (weight 0 drops it);
- each epoch is shuffled and cut into batches of `batch_size` (the last may be smaller).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ajet.sft.replay import ReservoirBuffer, mix_round


@dataclass(frozen=True)
class Batch:
    round: int
    epoch: int
    indices: tuple[int, ...]  # dialog indices


def mixture(items: Sequence[int], task_types: Sequence[str], weights: Mapping[str, float],
            rng: random.Random) -> list[int]:
    """`items` repeated / subsampled per task type by its weight (unlisted types weigh 1)."""
    by_type: dict[str, list[int]] = {}
    for i in items:
        by_type.setdefault(task_types[i], []).append(i)
    out: list[int] = []
    for task_type in sorted(by_type):
        members = by_type[task_type]
        weight = float(weights.get(task_type, 1.0))
        if weight < 0:
            raise ValueError(f"sft.task_weights.{task_type}={weight} must be >= 0")
        whole = math.floor(weight)
        out += members * whole
        extra = round((weight - whole) * len(members))
        out += rng.sample(members, extra)
    return out


def split_rounds(order: Sequence[int], rounds: int) -> list[list[int]]:
    """`order` cut into `rounds` consecutive chunks of near-equal size (earlier ones larger)."""
    if rounds < 1:
        raise ValueError(f"sft.rounds must be >= 1, got {rounds}")
    size, rest = divmod(len(order), rounds)
    out, start = [], 0
    for r in range(rounds):
        end = start + size + (1 if r < rest else 0)
        out.append(list(order[start:end]))
        start = end
    return out


def plan_batches(order: Sequence[int], task_types: Sequence[str], *, rounds: int, epochs: int,
                 batch_size: int, task_weights: Mapping[str, float], replay_size: int,
                 replay_ratio: float, seed: int) -> list[Batch]:
    """Every optimizer step's dialogs, in training order."""
    if batch_size < 1 or epochs < 1:
        raise ValueError(f"batch_size and epochs must be >= 1, got {batch_size}, {epochs}")
    rng = random.Random(seed)
    buffer: ReservoirBuffer[int] = ReservoirBuffer(replay_size, seed + 1)
    batches: list[Batch] = []
    for r, chunk in enumerate(split_rounds(order, rounds)):
        data = mix_round(chunk, buffer, replay_ratio, rng) if replay_size else list(chunk)
        for epoch in range(epochs):
            epoch_items = mixture(data, task_types, task_weights, rng)
            rng.shuffle(epoch_items)
            for start in range(0, len(epoch_items), batch_size):
                batches.append(Batch(r, epoch, tuple(epoch_items[start : start + batch_size])))
        buffer.extend(chunk)
    return batches
