"""Regenerate train.jsonl / val.jsonl / test.jsonl: FrozenLake maps (deterministic, each with
a safe path).

    python tutorial/example_frozenlake/make_data.py

It then runs make_demos.py (demos.jsonl and demos_safe_moves.jsonl, the SFT warm-ups'
demonstrations, from train maps and maps of their own).

Each split's maps come from its own range of seeds; a test map that is already in train,
val or test is redrawn. Val is the split to tune settings on and to validate on during
training; test is only reported on (`eval.split: test`, `scripts/bench/learning.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import make_demos  # the SFT warm-up's demonstrations come from these train maps
from frozenlake_env import generate_map, map_size, map_task


def main() -> None:
    here = Path(__file__).parent
    taken: set[str] = set()
    for split, count, offset in (("train", 64, 0), ("val", 16, 10_000), ("test", 16, 20_000)):
        rows = []
        seed = offset
        while len(rows) < count:
            i = len(rows)
            grid = generate_map(map_size(i), seed=seed)
            seed += 1
            key = "/".join(grid)
            if split == "test" and key in taken:
                continue  # a test map is in no other split, nor twice in test (train and val: as first drawn)
            taken.add(key)
            rows.append(map_task(f"{split}-{i}", grid))
        (here / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    make_demos.main(here)


if __name__ == "__main__":
    main()
