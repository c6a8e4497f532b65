"""Online continual learning: a rehearsal buffer replayed into each new round. Pure.

The buffer keeps a uniform sample of everything it has seen with reservoir sampling
(Vitter's algorithm R): item number t (1-based) enters a full buffer of capacity C with
probability C / t, replacing a uniformly chosen slot. Each new round trains on its own
data plus `replay_count(len(new), ratio)` items drawn from the buffer, so replayed items
make up `ratio` of the round; then the round's data is added to the buffer.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ReservoirBuffer(Generic[T]):
    def __init__(self, capacity: int, seed: int) -> None:
        if capacity < 0:
            raise ValueError(f"replay buffer_size must be >= 0, got {capacity}")
        self.capacity = capacity
        self.items: list[T] = []
        self.seen = 0
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: T) -> None:
        self.seen += 1
        if len(self.items) < self.capacity:
            self.items.append(item)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.capacity:
            self.items[slot] = item

    def extend(self, items: Iterable[T]) -> None:
        for item in items:
            self.add(item)

    def sample(self, k: int, rng: random.Random) -> list[T]:
        """`k` distinct buffer entries (all of them when k >= len)."""
        return rng.sample(self.items, min(k, len(self.items)))

    def state_dict(self) -> dict[str, Any]:
        return {"items": list(self.items), "seen": self.seen, "rng": self._rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.items, self.seen = list(state["items"]), int(state["seen"])
        self._rng.setstate(state["rng"])


def replay_count(n_new: int, ratio: float) -> int:
    """Replayed items that make up `ratio` of a round with `n_new` new items."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"replay ratio must be in [0, 1), got {ratio}")
    return round(n_new * ratio / (1.0 - ratio))


def mix_round(new: Sequence[T], buffer: ReservoirBuffer[T], ratio: float, rng: random.Random) -> list[T]:
    """The round's training items: all new ones plus the replayed ones (fewer if the buffer is short)."""
    return list(new) + buffer.sample(replay_count(len(new), ratio), rng)
