"""The math agent's calculator, its one copy: the system prompt that asks for it, the arithmetic
it evaluates (no `eval`), the pattern of an expression, the `calculate` tool's OpenAI spec, and a
function that runs one OpenAI-style tool call.

Standard library only, and it imports no sibling: the AgentScope variant (math_agent.py, which
builds its own spec from `calculate`'s signature), the OpenAI-SDK and raw-HTTP variants, the
remote agent (tutorial/example_remote_agent/agent.py, another process), the SFT warm-up's
dialogs (tutorial/example_sft_warmup/make_data.py) and the benchmarks all take it from here.
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

SYSTEM_PROMPT = (
    "You solve arithmetic word problems with the `calculate` tool. First call `calculate` with "
    "the expression made of the problem's numbers: for \"Tom buys 12 boxes with 34 pens in each "
    "box\", the expression is \"12 * 34\". Then answer with the tool's result in \\boxed{}, "
    "e.g. \\boxed{408}."
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

MAX_EXPRESSION_CHARS = 200
# What a model-written expression can raise beyond a syntax error: a result too large for a
# float (OverflowError), nesting too deep for the parser or the evaluation (RecursionError,
# MemoryError). Each is a result the model reads, never a crashed episode.
CALCULATOR_ERRORS = (SyntaxError, ValueError, ZeroDivisionError, TypeError, OverflowError, RecursionError,
                     MemoryError)


def arithmetic(expression: str) -> str:
    """The calculator: the value of `expression` (numbers, + - * / and parentheses; no `eval`),
    or "error: ..." for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: the expression is longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        return f"{node_value(ast.parse(expression, mode='eval').body):g}"
    except CALCULATOR_ERRORS as exc:
        return f"error: {type(exc).__name__}: {exc}" if str(exc) else f"error: {type(exc).__name__}"


def node_value(node: ast.AST) -> float:
    """The value of a parsed expression; a ValueError for anything but numbers and + - * /."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](node_value(node.left), node_value(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -node_value(node.operand)
    raise ValueError("only numbers and + - * / are allowed")


# What an expression may be: a forced call is decoded under the tool's schema
# (rollout.first_call_tool_choice, rollout.tool_call_grammar), so the model cannot write prose there.
EXPRESSION_PATTERN = r"^[0-9+\-*/(). ]{1,60}$"


def tool_spec(expression: dict[str, Any]) -> dict[str, Any]:
    """The `calculate` tool's OpenAI spec, with `expression` as its argument's JSON schema."""
    return {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": 'Evaluate an arithmetic expression such as "12 * (3 + 4)".',
            "parameters": {"type": "object", "properties": {"expression": expression}, "required": ["expression"]},
        },
    }


EXPRESSION = {"type": "string", "description": "The arithmetic expression to evaluate."}
# What the OpenAI-SDK and raw-HTTP variants offer, and the SFT warm-up's dialogs show.
CALCULATE_TOOL = tool_spec(EXPRESSION)
# With the expression's pattern: what the AgentScope variant offers (math_agent.calculate's
# annotation), and the remote agent, whose first call `ajet serve` forces.
CALCULATE_TOOL_WITH_PATTERN = tool_spec({**EXPRESSION, "pattern": EXPRESSION_PATTERN})


def run_tool_call(tool_call: dict[str, Any]) -> str:
    """The text result of one OpenAI-style tool call (errors are results too: the agent sees them)."""
    function = tool_call.get("function") or {}
    if function.get("name") != "calculate":
        return f"error: unknown tool {function.get('name')!r}; the only tool is `calculate`"
    try:
        arguments = json.loads(function.get("arguments") or "{}")
        expression = str(arguments["expression"])
    except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as exc:
        return f"error: bad arguments ({type(exc).__name__}: {exc}); call calculate(expression=...)"
    return arithmetic(expression)
