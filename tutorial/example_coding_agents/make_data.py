"""Regenerate train.jsonl / val.jsonl / test.jsonl: tiny repositories, each with one bug and a
unit test that fails until the bug is fixed (deterministic).

    python tutorial/example_coding_agents/make_data.py

A task is one small module (`<name>.py`, one function with a planted bug: a wrong operator, an
off-by-one, a wrong start value, a flipped comparison) and `test_<name>.py` (unittest). The
harness gets the issue text as its task; the reward is 1.0 when `python3 -m unittest -q` runs
and passes every original test on the harness's edited module, in a fresh sandbox
(coding.grade), else 0.0. Each task also carries its fixed module
(`fixed`), which the tests use to check that the reward can be earned.

Splits are by function: test holds functions neither train nor val has.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# (name, signature, body with {op} where the bug goes, the right op, the wrong ops, tests).
FUNCTIONS = [
    ("add", "a, b", "return a {op} b", "+", ["-", "*"], ["add(2, 3) == 5", "add(-1, 1) == 0", "add(10, 5) == 15"]),
    ("subtract", "a, b", "return a {op} b", "-", ["+", "*"], ["subtract(5, 3) == 2", "subtract(0, 4) == -4"]),
    ("multiply", "a, b", "return a {op} b", "*", ["+", "**"], ["multiply(3, 4) == 12", "multiply(0, 7) == 0"]),
    ("is_even", "n", "return n % 2 {op} 0", "==", ["!=", ">"], ["is_even(4)", "not is_even(7)", "is_even(0)"]),
    ("is_positive", "n", "return n {op} 0", ">", ["<", ">="], ["is_positive(3)", "not is_positive(0)", "not is_positive(-2)"]),
    ("larger", "a, b", "return a if a {op} b else b", ">", ["<", "=="], ["larger(3, 9) == 9", "larger(8, 2) == 8"]),
    ("smaller", "a, b", "return a if a {op} b else b", "<", [">", "=="], ["smaller(3, 9) == 3", "smaller(8, 2) == 2"]),
    ("total", "items", "result = {op}\n    for item in items:\n        result += item\n    return result", "0", ["1", "-1"],
     ["total([1, 2, 3]) == 6", "total([]) == 0"]),
    ("product", "items", "result = {op}\n    for item in items:\n        result *= item\n    return result", "1", ["0", "2"],
     ["product([2, 3, 4]) == 24", "product([]) == 1"]),
    ("count_up", "n", "return list(range(1, n {op}))", "+ 1", ["", "- 1"], ["count_up(3) == [1, 2, 3]", "count_up(1) == [1]"]),
    ("last_item", "items", "return items[{op}]", "-1", ["0", "1"], ["last_item([4, 5, 6]) == 6", "last_item([9]) == 9"]),
    ("first_item", "items", "return items[{op}]", "0", ["-1", "1"], ["first_item([4, 5, 6]) == 4", "first_item([9]) == 9"]),
    ("square", "n", "return n {op} n", "*", ["+", "-"], ["square(3) == 9", "square(-4) == 16"]),
    ("double", "n", "return n {op} 2", "*", ["+", "**"], ["double(5) == 10", "double(0) == 0", "double(-3) == -6"]),
    ("halve", "n", "return n {op} 2", "//", ["*", "%"], ["halve(10) == 5", "halve(7) == 3"]),
    ("shout", "text", "return text.{op}() + '!'", "upper", ["lower", "title"], ["shout('hi') == 'HI!'", "shout('Ok') == 'OK!'"]),
    ("whisper", "text", "return text.{op}()", "lower", ["upper", "title"], ["whisper('HI') == 'hi'", "whisper('Ok') == 'ok'"]),
    ("count_vowels", "text", "return sum(1 for ch in text if ch {op} 'aeiou')", "in", ["not in"],
     ["count_vowels('banana') == 3", "count_vowels('xyz') == 0"]),
    ("reverse", "text", "return text[::{op}]", "-1", ["1", "2"], ["reverse('abc') == 'cba'", "reverse('') == ''"]),
    ("clamp", "n, low, high", "return max(low, {op}(n, high))", "min", ["max"],
     ["clamp(5, 0, 3) == 3", "clamp(-1, 0, 3) == 0", "clamp(2, 0, 3) == 2"]),
    ("average", "items", "return sum(items) {op} len(items)", "/", ["*", "-"], ["average([2, 4]) == 3", "average([5]) == 5"]),
    ("remainder", "a, b", "return a {op} b", "%", ["//", "-"], ["remainder(7, 3) == 1", "remainder(9, 3) == 0"]),
    ("power", "a, b", "return a {op} b", "**", ["*", "+"], ["power(2, 3) == 8", "power(5, 0) == 1"]),
    ("negate", "n", "return {op}n", "-", ["+", "~"], ["negate(4) == -4", "negate(-2) == 2"]),
]
ISSUE = ("The function `{name}` in `{module}.py` is wrong: `{example}` fails. Fix the bug in "
         "`{module}.py` so that `python3 -m unittest` passes. Do not change the tests.")


def module_source(name: str, signature: str, body: str, op: str) -> str:
    return f"def {name}({signature}):\n    {body.format(op=op)}\n"


def test_source(module: str, name: str, checks: list[str]) -> str:
    lines = [f"import unittest\n\nfrom {module} import {name}\n\n\nclass Test{name.title().replace('_', '')}(unittest.TestCase):"]
    for i, check in enumerate(checks):
        lines.append(f"    def test_{i}(self):\n        self.assertTrue({check})")
    return "\n".join(lines) + "\n\n\nif __name__ == '__main__':\n    unittest.main()\n"


def fails_with(source: str, checks: list[str]) -> str:
    """The first check that the (buggy) source fails: the issue's example."""
    namespace: dict = {}
    exec(source, namespace)  # our own generated source
    for check in checks:
        try:
            if not eval(check, namespace):  # noqa: S307 - our own generated checks
                return check
        except Exception:  # noqa: BLE001 - a crash is a failure too
            return check
    return ""


def tasks_for(split: str, functions: list[tuple], rng: random.Random) -> list[dict]:
    tasks = []
    for name, signature, body, right, wrongs, checks in functions:
        module = f"{name}_utils"
        fixed = module_source(name, signature, body, right)
        assert not fails_with(fixed, checks), f"{name}: the fixed module fails its own test"
        for wrong in wrongs:
            buggy = module_source(name, signature, body, wrong)
            example = fails_with(buggy, checks)
            if not example:
                continue  # this wrong op happens to pass: not a bug the test can see
            tasks.append({
                "task_id": f"{split}-{name}-{len(tasks)}",
                "question": ISSUE.format(name=name, module=module, example=example),
                "files": {f"{module}.py": buggy, f"test_{module}.py": test_source(module, name, checks)},
                "fixed": {f"{module}.py": fixed},
                "test": "python3 -m unittest -q",
            })
    rng.shuffle(tasks)
    return tasks


def main() -> None:
    here = Path(__file__).parent
    functions = list(FUNCTIONS)
    random.Random(0).shuffle(functions)
    splits = {"test": functions[:5], "val": functions[5:9], "train": functions[9:]}
    rng = random.Random(1)
    for split, chosen in splits.items():
        tasks = tasks_for(split, chosen, rng)
        (here / f"{split}.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
        print(f"{split}: {len(tasks)} tasks")


if __name__ == "__main__":
    main()
