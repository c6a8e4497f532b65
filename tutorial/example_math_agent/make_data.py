"""Regenerate train.jsonl / val.jsonl: small arithmetic word problems (deterministic).

    python tutorial/example_math_agent/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Mia", "Ken", "Zoe"]
ITEMS = ["apples", "pens", "books", "coins", "cards", "stamps", "shells", "marbles"]


def problem(rng: random.Random, index: int, split: str) -> dict:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 40), rng.randint(2, 30)
    kind = rng.choice(["add", "sub", "mul"])
    if kind == "add":
        q, ans = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b
    elif kind == "sub":
        a, b = max(a, b), min(a, b)
        q, ans = f"{name} has {a} {item} and gives away {b}. How many {item} are left?", a - b
    else:
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        q, ans = f"{name} buys {a} boxes with {b} {item} in each box. How many {item} is that in total?", a * b
    return {"task_id": f"{split}-{index}", "question": q, "answer": str(ans)}


def main() -> None:
    here = Path(__file__).parent
    for split, count, seed in (("train", 256, 0), ("val", 32, 1)):
        rng = random.Random(seed)
        lines = [json.dumps(problem(rng, i, split)) for i in range(count)]
        (here / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
