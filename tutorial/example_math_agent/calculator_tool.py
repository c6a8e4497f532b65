"""The calculator tool of the OpenAI-SDK and raw-HTTP variants: its OpenAI tool spec and a
function that runs one tool call. (The AgentScope variant registers `math_agent.calculate`.)"""

from __future__ import annotations

import json
from typing import Any

from math_agent import arithmetic  # the same ast-safe arithmetic as the AgentScope variant

CALCULATE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": 'Evaluate an arithmetic expression such as "12 * (3 + 4)".',
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "The arithmetic expression to evaluate."}
            },
            "required": ["expression"],
        },
    },
}


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
