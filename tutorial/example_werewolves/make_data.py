"""Regenerate train.jsonl / val.jsonl: werewolves seatings (deterministic).

    python tutorial/example_werewolves/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from game import ROLES

NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy"]


def main() -> None:
    here = Path(__file__).parent
    for split, count, seed in (("train", 64, 0), ("val", 16, 1)):
        rng = random.Random(seed)
        rows = []
        for i in range(count):
            names = rng.sample(NAMES, len(ROLES))
            roles = rng.sample(ROLES, len(ROLES))
            rows.append({
                "task_id": f"{split}-{i}",
                "question": f"A game of werewolves with {', '.join(names)}.",
                "players": dict(zip(names, roles, strict=True)),
            })
        (here / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
