"""`countdown`: reach `target` with the given `numbers` and + - * / (and parentheses).

Task metadata: `numbers` (list of numbers) and `target`. The answer is an arithmetic
expression; from `<answer>...</answer>` when present, and only its left side when it is
written as an equation ("(6+4)*2 = 20"). It is parsed with `ast` (never `eval`): only number
literals, + - * /, unary minus and parentheses are allowed, and it is evaluated exactly with
fractions. Each given number may be used at most once (`use_all_numbers=true`: exactly once).

Reward: 1.0 when the value equals the target and the numbers are used as allowed;
`format_score` (default 0.1) for a well-formed expression that misses (wrong value, numbers
not given or used too often, division by zero); 0.0 when there is no well-formed expression.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from fractions import Fraction

from ajet.judge.base import JudgeError, answer_text
from ajet.workflow import WorkflowOutput, WorkflowTask

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


class MalformedExpression(ValueError):
    """Not an expression of numbers, + - * / and parentheses."""


def extract_expression(text: str) -> str:
    tagged = _ANSWER_TAG.findall(text)
    expr = tagged[-1] if tagged else text
    expr = expr.replace("×", "*").replace("÷", "/").replace("−", "-").replace("\\times", "*")
    return expr.split("=")[0].strip().rstrip(".").strip()


def parse_expression(expr: str, max_length: int = 300) -> tuple[ast.expr, list[Fraction]]:
    """The expression's AST and its number literals, or `MalformedExpression`."""
    if not expr or len(expr) > max_length:
        raise MalformedExpression(f"empty or longer than {max_length} characters")
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as exc:
        raise MalformedExpression(f"not an arithmetic expression: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # nesting too deep; a NUL byte
        raise MalformedExpression(f"not an arithmetic expression: {type(exc).__name__}") from None
    numbers: list[Fraction] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise MalformedExpression(f"only numbers are allowed, got {node.value!r}")
            if isinstance(node.value, float) and not math.isfinite(node.value):  # 1e999 parses as inf
                raise MalformedExpression(f"{node.value} is not a finite number")
            numbers.append(Fraction(str(node.value)))
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _OPS:
                raise MalformedExpression(f"operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                raise MalformedExpression(f"operator {type(node.op).__name__} is not allowed")
        elif not isinstance(node, (ast.operator, ast.unaryop)):
            raise MalformedExpression(f"{type(node).__name__} is not allowed")
    return tree, numbers


def evaluate(node: ast.expr) -> Fraction:
    """Exact value of a tree accepted by `parse_expression`; ZeroDivisionError on x/0."""
    if isinstance(node, ast.Constant):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp):
        value = evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    assert isinstance(node, ast.BinOp)
    return _OPS[type(node.op)](evaluate(node.left), evaluate(node.right))


def numbers_allowed(used: list[Fraction], given: list[Fraction], use_all: bool) -> bool:
    used_count, given_count = Counter(used), Counter(given)
    if use_all:
        return used_count == given_count
    return all(used_count[n] <= given_count[n] for n in used_count)


class CountdownJudge:
    def __init__(self, format_score: float = 0.1, use_all_numbers: bool = False,
                 max_length: int = 300) -> None:
        self.format_score = format_score
        self.use_all_numbers = use_all_numbers
        self.max_length = max_length

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        given, target = _task_numbers(task)
        try:
            tree, used = parse_expression(extract_expression(answer_text(output)), self.max_length)
        except MalformedExpression:
            return 0.0, False
        if not numbers_allowed(used, given, self.use_all_numbers):
            return self.format_score, False
        try:
            value = evaluate(tree)
        except ZeroDivisionError:
            return self.format_score, False
        if value == target:
            return 1.0, True
        return self.format_score, False


def _task_numbers(task: WorkflowTask) -> tuple[list[Fraction], Fraction]:
    meta = task.metadata
    if "numbers" not in meta or "target" not in meta:
        raise JudgeError(
            f"countdown task '{task.task_id}' needs metadata 'numbers' (a list) and 'target'; "
            f"it has {sorted(meta)}"
        )
    try:
        return [Fraction(str(n)) for n in meta["numbers"]], Fraction(str(meta["target"]))
    except (TypeError, ValueError) as exc:
        raise JudgeError(f"countdown task '{task.task_id}': bad numbers/target: {exc}") from None
