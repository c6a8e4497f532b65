"""Regenerate train.jsonl / val.jsonl / test.jsonl: countdown puzzles (deterministic).

    python tutorial/example_countdown/make_data.py

Each puzzle is built backwards from a random expression over 3 or 4 of the numbers, so
it always has a solution (the `solution` field; the judge does not read it). Val is the split
to tune settings on and to validate on during training; test is only reported on
(`eval.split: test`) and holds no puzzle of train or val. Then make_demos.py writes demos.jsonl
from train.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

OPS = ("+", "-", "*", "/")


def puzzle(rng: random.Random) -> tuple[list[int], int, str]:
    """(numbers, target, a solution); target is a positive integer up to 100."""
    while True:
        numbers = [rng.randint(1, 25) for _ in range(rng.choice((3, 4)))]
        order = rng.sample(numbers, len(numbers))
        value, expr = Fraction(order[0]), str(order[0])
        for n in order[1:]:
            op = rng.choice(OPS)  # numbers are >= 1: no division by zero
            value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n}[op]
            expr = f"({expr} {op} {n})"
        if value.denominator == 1 and 1 <= value <= 100:
            return numbers, int(value), expr[1:-1] if expr.startswith("(") else expr


def main() -> None:
    here = Path(__file__).parent
    taken: set[str] = set()
    for split, count, seed in (("train", 200, 0), ("val", 20, 1), ("test", 20, 2)):
        rng = random.Random(seed)
        rows = []
        while len(rows) < count:
            numbers, target, solution = puzzle(rng)
            question = f"Using the numbers {numbers}, make {target}."
            if split == "test" and question in taken:
                continue  # (train and val were drawn before test existed: kept as they are)
            taken.add(question)
            rows.append({
                "task_id": f"{split}-{len(rows)}",
                "question": question,
                "numbers": numbers,
                "target": target,
                "solution": solution,
            })
        (here / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    import make_demos  # the SFT demonstrations are made from train (countdown_warmup.yaml)

    make_demos.main()


if __name__ == "__main__":
    main()
