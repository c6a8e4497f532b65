"""Regenerate train.jsonl / val.jsonl / test.jsonl (arithmetic word problems that need the
calculator), code_train.jsonl / code_val.jsonl / code_test.jsonl (the code agent's: the same
splits plus problems where code helps) and demos.jsonl / code_demos.jsonl (the scripted agents'
demonstrations on train, `make_demos.py`; the code agent's need the sandbox: `make sandbox`).

    python tutorial/example_math_agent/make_data.py

Train and val draw from the same templates (`TRAIN_KINDS`): products of two two-digit
numbers, sums and differences of three-digit numbers ("started with 734 and used 286"),
prices ("one lamp costs 37 dollars") and two-step problems (a product and a sum or a
difference, change from a payment, gains then losses). Many templates, so what the agent has
to learn is to read a problem into an expression, not to fill in one template. A 135M model
cannot do this arithmetic in its head: an episode succeeds by calling `calculate` with the
right expression and copying its result into `\\boxed{}`.

Test draws from other templates (`TEST_KINDS`): phrasings train never shows (shelves,
machines per hour, "how many more than") and operations it never needs (a division, a sum
in parentheses times a number, four operations). Val is the split to tune settings on and to
validate on during training; test is only reported on (`eval.split: test`), never used to
choose anything.

Each task keeps its template (`kind`), the expression that solves it (`expression`; the
scripted agent of `make_demos.py` uses it to write demonstrations for the SFT warm-up) and
its number of operations (`difficulty`, 1-4), which the curriculum orders tasks by.

The code agent (code_agent.py) trains on the same splits plus problems where code helps
(`CODE_TRAIN_KINDS`, `CODE_TEST_KINDS`): sums over a range, doubling and tripling over dozens of
steps, weekly savings that grow, counting multiples, products too big to carry in one's head.
A four-operation expression cannot write a loop, and the answers run to 20 digits. Each keeps
the `program` that solves it, which the code agent's demonstrations run in the sandbox.

The splits are disjoint by construction: each draws its numbers from its own seed and a
question that occurred in an earlier split is redrawn. Deterministic: the same files every
time.
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Callable
from pathlib import Path

from calculator_tool import node_value

NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Mia", "Ken", "Zoe"]
ITEMS = ["apples", "pens", "books", "coins", "cards", "stamps", "shells", "marbles"]
GOODS = [("pen", "pens"), ("book", "books"), ("ticket", "tickets"), ("lamp", "lamps"), ("plate", "plates")]

Problem = tuple[str, str]  # (question, expression)


def _mul(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    return (f"{name} buys {a} boxes with {b} {item} in each box. How many {item} is that in total?",
            f"{a} * {b}")


def _mul_sub(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    c = rng.randint(11, a * b - 1)
    return (f"{name} buys {a} boxes with {b} {item} in each box and gives away {c} {item}. "
            f"How many {item} are left?", f"{a} * {b} - {c}")


def _mul_add(rng: random.Random, name: str, item: str) -> Problem:
    a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(11, 99)
    return (f"{name} has {c} {item} and buys {a} boxes with {b} {item} in each box. "
            f"How many {item} does {name} have now?", f"{c} + {a} * {b}")


def _two_mul(rng: random.Random, name: str, item: str) -> Problem:
    a, b, c, d = (rng.randint(11, 99) for _ in range(4))
    return (f"{name} buys {a} boxes with {b} {item} each and {c} bags with {d} {item} each. "
            f"How many {item} is that in total?", f"{a} * {b} + {c} * {d}")


def _add(rng: random.Random, name: str, item: str) -> Problem:
    x, y = rng.randint(100, 999), rng.randint(100, 999)
    return (f"{name} has {x} {item} and gets {y} more. How many {item} does {name} have now?", f"{x} + {y}")


def _used(rng: random.Random, name: str, item: str) -> Problem:
    x = rng.randint(300, 999)
    y = rng.randint(100, x - 11)
    return (f"{name} started with {x} {item} and used {y} of them. How many {item} are left?", f"{x} - {y}")


def _price(rng: random.Random, name: str, item: str) -> Problem:
    one, many = rng.choice(GOODS)
    p, q = rng.randint(11, 99), rng.randint(11, 99)
    return f"One {one} costs {p} dollars. How much do {q} {many} cost, in dollars?", f"{q} * {p}"


def _change(rng: random.Random, name: str, item: str) -> Problem:
    one, many = rng.choice(GOODS)
    p, q = rng.randint(11, 99), rng.randint(11, 99)
    paid = (q * p // 100 + rng.randint(1, 9)) * 100
    return (f"{name} buys {q} {many} at {p} dollars each and pays with {paid} dollars. "
            f"How much change does {name} get, in dollars?", f"{paid} - {q} * {p}")


def _gain_loss(rng: random.Random, name: str, item: str) -> Problem:
    x, y = rng.randint(100, 999), rng.randint(100, 999)
    z = rng.randint(100, x + y - 11)
    return (f"{name} has {x} {item}, gets {y} more and then gives away {z}. How many {item} are left?",
            f"{x} + {y} - {z}")


# ---- test only: phrasings and operations that train never shows


def _shelves(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    return f"A shelf holds {b} {item}. How many {item} fit on {a} shelves?", f"{a} * {b}"


def _per_hour(rng: random.Random, name: str, item: str) -> Problem:
    r, h = rng.randint(11, 99), rng.randint(11, 99)
    return (f"A machine makes {r} {item} every hour. How many {item} does it make in {h} hours?",
            f"{h} * {r}")


def _more_than(rng: random.Random, name: str, item: str) -> Problem:
    other = rng.choice([n for n in NAMES if n != name])
    x = rng.randint(300, 999)
    y = rng.randint(100, x - 11)
    return (f"{name} has {x} {item} and {other} has {y}. How many more {item} does {name} have than {other}?",
            f"{x} - {y}")


def _share(rng: random.Random, name: str, item: str) -> Problem:
    k, m = rng.randint(11, 29), rng.randint(11, 49)
    return (f"{name} shares {k * m} {item} equally among {k} friends. How many {item} does each friend get?",
            f"{k * m} / {k}")


def _grouped(rng: random.Random, name: str, item: str) -> Problem:
    a, b, c = rng.randint(11, 49), rng.randint(11, 49), rng.randint(11, 49)
    return (f"{name} packs {a} red boxes and {b} blue boxes, and every box holds {c} {item}. "
            f"How many {item} are packed?", f"({a} + {b}) * {c}")


def _broken(rng: random.Random, name: str, item: str) -> Problem:
    a, b, c, d = (rng.randint(11, 59) for _ in range(4))
    z = rng.randint(11, 99)
    return (f"A school orders {a} packs of {b} {item} and {c} packs of {d} {item}; {z} of them arrive "
            f"broken. How many usable {item} does the school get?", f"{a} * {b} + {c} * {d} - {z}")


TRAIN_KINDS: dict[str, Callable[[random.Random, str, str], Problem]] = {
    "mul": _mul, "mul_sub": _mul_sub, "mul_add": _mul_add, "two_mul": _two_mul,
    "add": _add, "used": _used, "price": _price, "change": _change, "gain_loss": _gain_loss,
}
TEST_KINDS: dict[str, Callable[[random.Random, str, str], Problem]] = {
    "shelves": _shelves, "per_hour": _per_hour, "more_than": _more_than,
    "share": _share, "grouped": _grouped, "broken": _broken,
}
# (split, count, seed, templates)
SPLITS = (("train", 256, 0, TRAIN_KINDS), ("val", 32, 1, TRAIN_KINDS), ("test", 32, 2, TEST_KINDS))


# ---- problems where code helps (the code agent's splits add them): loops, several steps and
# big integers that a four-operation expression cannot write or a 135M model cannot carry.
# Each template gives (question, the program that solves it, its answer); the scripted code
# agent's demonstrations (make_demos.py --agent code) run that program in the sandbox.

CodeProblem = tuple[str, str, int]


def _sum_range(rng: random.Random, name: str, item: str) -> CodeProblem:
    n = rng.randint(50, 999)
    return (f"{name} writes the whole numbers from 1 to {n} on a board and adds them all up. What is the sum?",
            f"total = 0\nfor k in range(1, {n + 1}):\n    total += k\nprint(total)", n * (n + 1) // 2)


def _doubling(rng: random.Random, name: str, item: str) -> CodeProblem:
    a, days = rng.randint(2, 9), rng.randint(30, 60)
    return (f"{name} puts {a} {item} in a jar on day 1, and every day after that the number of {item} in the "
            f"jar doubles. How many {item} are in the jar on day {days}?",
            f"n = {a}\nfor day in range(2, {days + 1}):\n    n = n * 2\nprint(n)", a * 2 ** (days - 1))


def _savings(rng: random.Random, name: str, item: str) -> CodeProblem:
    first, more, weeks = rng.randint(2, 30), rng.randint(2, 15), rng.randint(20, 80)
    return (f"{name} saves {first} dollars in the first week and each week {more} dollars more than the week "
            f"before. How many dollars has {name} saved after {weeks} weeks?",
            f"total = 0\nweekly = {first}\nfor week in range({weeks}):\n    total += weekly\n"
            f"    weekly += {more}\nprint(total)", sum(first + more * w for w in range(weeks)))


def _multiples(rng: random.Random, name: str, item: str) -> CodeProblem:
    n, k = rng.randint(200, 9999), rng.randint(3, 19)
    return (f"How many whole numbers from 1 to {n} can be divided by {k} with nothing left over?",
            f"print(len([x for x in range(1, {n + 1}) if x % {k} == 0]))", n // k)


def _big_product(rng: random.Random, name: str, item: str) -> CodeProblem:
    a, b, c = rng.randint(1000, 99999), rng.randint(1000, 99999), rng.randint(100, 9999)
    return (f"A warehouse has {a} pallets; each pallet holds {b} boxes and each box holds {c} {item}. "
            f"How many {item} are in the warehouse?", f"print({a} * {b} * {c})", a * b * c)


# test only: other phrasings and other loops


def _squares(rng: random.Random, name: str, item: str) -> CodeProblem:
    n = rng.randint(20, 300)
    return (f"What is the sum of the squares of the whole numbers from 1 to {n}?",
            f"print(sum(k * k for k in range(1, {n + 1})))", n * (n + 1) * (2 * n + 1) // 6)


def _tripling(rng: random.Random, name: str, item: str) -> CodeProblem:
    a, hours = rng.randint(2, 50), rng.randint(20, 40)
    return (f"A colony of {a} bacteria triples in size every hour. How many bacteria are there after {hours} hours?",
            f"n = {a}\nfor hour in range({hours}):\n    n = n * 3\nprint(n)", a * 3 ** hours)


def _even_sum(rng: random.Random, name: str, item: str) -> CodeProblem:
    n = rng.randint(100, 2000)
    return (f"{name} adds up every even number from 1 to {n}. What total does {name} get?",
            f"print(sum(k for k in range(2, {n + 1}, 2)))", (n // 2) * (n // 2 + 1))


CODE_TRAIN_KINDS: dict[str, Callable[[random.Random, str, str], CodeProblem]] = {
    "sum_range": _sum_range, "doubling": _doubling, "savings": _savings, "multiples": _multiples,
    "big_product": _big_product,
}
CODE_TEST_KINDS: dict[str, Callable[[random.Random, str, str], CodeProblem]] = {
    "squares": _squares, "tripling": _tripling, "even_sum": _even_sum,
}
# The code agent's splits: the math split (same tasks) plus these. (split, count, seed, templates)
CODE_SPLITS = (("train", 128, 10, CODE_TRAIN_KINDS), ("val", 16, 11, CODE_TRAIN_KINDS),
               ("test", 16, 12, CODE_TEST_KINDS))

def evaluate(expression: str) -> int:
    """The value of one of the templates' expressions (integers, + - * / and parentheses), as
    the calculator computes it; every template is built so that it is a whole number."""
    result = node_value(ast.parse(expression, mode="eval").body)
    if result != int(result) or result <= 0:
        raise ValueError(f"{expression!r} = {result}: the templates make positive whole numbers")
    return int(result)


def difficulty(expression: str) -> int:
    """Operations in the expression: 1 (one product, sum or difference) to 4. The curriculum
    (task_reader.curriculum.key: difficulty) starts GRPO on the one-operation tasks."""
    return sum(expression.count(op) for op in (" * ", " + ", " - ", " / "))


def split_tasks(split: str, count: int, seed: int, kinds: dict, taken: set[str]) -> list[dict]:
    rng = random.Random(seed)
    tasks: list[dict] = []
    while len(tasks) < count:
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        kind = rng.choice(sorted(kinds))
        question, expression = kinds[kind](rng, name, item)
        if question in taken:
            continue  # never the same question twice, nor in two splits
        taken.add(question)
        tasks.append({"task_id": f"{split}-{len(tasks)}", "question": question,
                      "answer": str(evaluate(expression)), "expression": expression,
                      "difficulty": difficulty(expression), "kind": kind})
    return tasks


def code_split_tasks(split: str, count: int, seed: int, kinds: dict, taken: set[str]) -> list[dict]:
    """Problems where code helps: each keeps the `program` that solves it (the code agent's
    demonstrations run it); `difficulty` 3, past the one- and two-operation tasks."""
    rng = random.Random(seed)
    tasks: list[dict] = []
    while len(tasks) < count:
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        kind = rng.choice(sorted(kinds))
        question, program, answer = kinds[kind](rng, name, item)
        if question in taken:
            continue
        taken.add(question)
        tasks.append({"task_id": f"code-{split}-{len(tasks)}", "question": question, "answer": str(answer),
                      "program": program, "difficulty": 3, "kind": kind})
    return tasks


def _write(path: Path, tasks: list[dict]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def main(out_dir: Path | None = None) -> list[Path]:
    out_dir = out_dir or Path(__file__).parent
    taken: set[str] = set()
    splits = {split: split_tasks(split, count, seed, kinds, taken) for split, count, seed, kinds in SPLITS}
    paths = [_write(out_dir / f"{split}.jsonl", tasks) for split, tasks in splits.items()]
    for split, count, seed, kinds in CODE_SPLITS:  # code_<split>.jsonl: the math split, then code's own
        code_tasks = code_split_tasks(split, count, seed, kinds, taken)
        paths.append(_write(out_dir / f"code_{split}.jsonl", splits[split] + code_tasks))
    from make_demos import main as make_demos  # this directory is on sys.path (script or test)

    paths.append(make_demos(out_dir))
    paths.append(make_demos(out_dir, agent="code"))  # code_agent.py's programs run in the sandbox
    return paths


if __name__ == "__main__":
    main()
