"""Regenerate train.jsonl / val.jsonl: one-digit additions (deterministic).

    python tutorial/example_function_workflow/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def main() -> None:
    here = Path(__file__).parent
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(0).shuffle(pairs)
    splits = {"val": pairs[:24], "train": pairs[24:]}  # held-out pairs never seen in training
    for split, items in splits.items():
        lines = [
            json.dumps({"task_id": f"{split}-{a}+{b}", "question": f"What is {a} + {b}?", "answer": str(a + b)})
            for a, b in items
        ]
        (here / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
