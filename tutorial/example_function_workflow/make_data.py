"""Regenerate train.jsonl / val.jsonl / test.jsonl: one-digit additions (deterministic).

    python tutorial/example_function_workflow/make_data.py

Train and val split the 81 pairs of 1-9 (val: 24 held-out pairs, the split to tune settings
on and to validate on during training). Test holds the 19 pairs with a 0 (0 + 7, 4 + 0,
0 + 0), which neither train nor val has: a held-out kind of pair, only reported on
(`eval.split: test`, `scripts/bench/learning.py`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def main() -> None:
    here = Path(__file__).parent
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(0).shuffle(pairs)
    with_zero = [(a, b) for a in range(10) for b in range(10) if 0 in (a, b)]
    splits = {"val": pairs[:24], "train": pairs[24:], "test": with_zero}  # held-out pairs never seen in training
    for split, items in splits.items():
        lines = [
            json.dumps({"task_id": f"{split}-{a}+{b}", "question": f"What is {a} + {b}?", "answer": str(a + b)})
            for a, b in items
        ]
        (here / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
