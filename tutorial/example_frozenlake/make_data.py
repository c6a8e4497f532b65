"""Regenerate train.jsonl / val.jsonl: FrozenLake maps (deterministic, each with a safe path).

    python tutorial/example_frozenlake/make_data.py
"""

from __future__ import annotations

import json
from pathlib import Path

from frozenlake_env import generate_map

QUERY = "Reach the goal G from the start S."


def main() -> None:
    here = Path(__file__).parent
    for split, count, offset in (("train", 64, 0), ("val", 16, 10_000)):
        rows = []
        for i in range(count):
            size = 4 if i % 4 else 5  # mostly 4x4, every 4th map 5x5
            rows.append({
                "task_id": f"{split}-{i}",
                "question": QUERY,
                "map": generate_map(size, seed=offset + i),
                # Enough for the shortest path (2 * (size - 1) moves) plus a few mistakes.
                "max_steps": 2 * (size - 1) + 2,
            })
        (here / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
