"""Regenerate train.jsonl / val.jsonl (arithmetic word problems that need the calculator) and
demos.jsonl (the scripted agent's demonstrations on train, `make_demos.py`).

    python tutorial/example_math_agent/make_data.py

Every problem multiplies two two-digit numbers, and most add a second step (a sum, a
difference, a second product): a 135M model cannot do that in its head, so an episode
succeeds by calling `calculate` with the right expression and copying its result into
`\\boxed{}`. Each task keeps the expression that solves it (`expression`), which the scripted
agent of `make_demos.py` uses to write demonstrations for the SFT warm-up, and its number of
operations (`difficulty`, 1-3), which a curriculum can order the tasks by.

The splits are disjoint by construction: train and val draw their numbers from different
seeds and every val question that also occurs in train is redrawn, so the 32 val tasks stay
held out. Deterministic: the same files every time.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Mia", "Ken", "Zoe"]
ITEMS = ["apples", "pens", "books", "coins", "cards", "stamps", "shells", "marbles"]
KINDS = ("mul", "mul_sub", "mul_add", "two_mul")
SPLITS = (("train", 256, 0), ("val", 32, 1))


def problem(rng: random.Random) -> tuple[str, str]:
    """(question, expression) of one problem."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    kind = rng.choice(KINDS)
    if kind == "mul":
        return (f"{name} buys {a} boxes with {b} {item} in each box. "
                f"How many {item} is that in total?", f"{a} * {b}")
    if kind == "mul_sub":
        c = rng.randint(11, a * b - 1)
        return (f"{name} buys {a} boxes with {b} {item} in each box and gives away {c} {item}. "
                f"How many {item} are left?", f"{a} * {b} - {c}")
    if kind == "mul_add":
        c = rng.randint(11, 99)
        return (f"{name} has {c} {item} and buys {a} boxes with {b} {item} in each box. "
                f"How many {item} does {name} have now?", f"{c} + {a} * {b}")
    c, d = rng.randint(11, 99), rng.randint(11, 99)
    return (f"{name} buys {a} boxes with {b} {item} each and {c} bags with {d} {item} each. "
            f"How many {item} is that in total?", f"{a} * {b} + {c} * {d}")


def evaluate(expression: str) -> int:
    """The value of one of `problem`'s expressions (integers, + - * only)."""
    total = 0
    for term in expression.replace(" - ", " + -").split(" + "):
        value = 1
        for factor in term.split(" * "):
            value *= int(factor)
        total += value
    return total


def difficulty(expression: str) -> int:
    """Operations in the expression: 1 (one product) to 3 (two products and a sum). The
    curriculum (task_reader.curriculum.key: difficulty) starts GRPO on the one-step tasks."""
    return sum(expression.count(op) for op in ("*", "+", " - "))


def split_tasks(split: str, count: int, seed: int, taken: set[str]) -> list[dict]:
    rng = random.Random(seed)
    tasks: list[dict] = []
    while len(tasks) < count:
        question, expression = problem(rng)
        if question in taken:
            continue  # never the same question twice, nor in both splits
        taken.add(question)
        tasks.append({"task_id": f"{split}-{len(tasks)}", "question": question,
                      "answer": str(evaluate(expression)), "expression": expression,
                      "difficulty": difficulty(expression)})
    return tasks


def main(out_dir: Path | None = None) -> list[Path]:
    out_dir = out_dir or Path(__file__).parent
    taken: set[str] = set()
    paths = []
    for split, count, seed in SPLITS:
        path = out_dir / f"{split}.jsonl"
        path.write_text("".join(json.dumps(t) + "\n" for t in split_tasks(split, count, seed, taken)))
        paths.append(path)
    from make_demos import main as make_demos  # this directory is on sys.path (script or test)

    paths.append(make_demos(out_dir))
    return paths


if __name__ == "__main__":
    main()
