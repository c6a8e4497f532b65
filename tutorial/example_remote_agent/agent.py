"""The math agent in Python, on `ajet.serve.client.EpisodeClient` and the OpenAI SDK, with its calculator.

    AJET_URL=http://127.0.0.1:8765 AJET_TOKEN=secret python tutorial/example_remote_agent/agent.py

It may run in any process or on any machine that reaches the server: it imports nothing of ajet
but the small httpx client. Optional: AJET_MAX_EPISODES, AJET_LOG (one JSON line per reply).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys
from typing import Any

import openai

from ajet.serve.client import EpisodeClient

SYSTEM_PROMPT = (
    "You solve arithmetic word problems with the `calculate` tool. First call `calculate` with "
    "the expression made of the problem's numbers: for \"Tom buys 12 boxes with 34 pens in each "
    "box\", the expression is \"12 * 34\". Then answer with the tool's result in \\boxed{}, "
    "e.g. \\boxed{408}."
)
CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": 'Evaluate an arithmetic expression such as "12 * (3 + 4)".',
        "parameters": {
            "type": "object",
            # The pattern is part of the contract: a call the server forces is decoded under it.
            "properties": {"expression": {"type": "string", "pattern": "^[0-9+\\-*/(). ]{1,60}$"}},
            "required": ["expression"],
        },
    },
}
MAX_TURNS = 3  # model calls an episode: the tool call, the answer, one spare
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """The tool: numbers, + - * / and parentheses only (no `eval`); errors are results the model reads."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only numbers and + - * / are allowed")

    if len(expression) > 200:
        return "error: the expression is longer than 200 characters"
    try:
        return f"{value(ast.parse(expression, mode='eval').body):g}"
    # a result too large for a float, nesting too deep: results the model reads, not a crash
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError, OverflowError, RecursionError,
            MemoryError) as exc:
        return f"error: {type(exc).__name__}: {exc}"


def tool_result(call: Any) -> str:
    if call.function.name != "calculate":
        return f"error: unknown tool {call.function.name!r}; the only tool is `calculate`"
    try:
        return calculate(str(json.loads(call.function.arguments or "{}")["expression"]))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return f"error: bad arguments ({type(exc).__name__}: {exc}); call calculate(expression=...)"


def solve(episode) -> str:  # noqa: ANN001 - an ajet.serve.client.RemoteEpisode
    """A tool loop: the model may call `calculate`; the episode's answer is its last text reply."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": episode.task["main_query"]},
    ]
    answer = ""
    # max_retries=0: a retried request whose first attempt already ran would be recorded twice.
    with openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0) as llm:
        for _ in range(MAX_TURNS):
            message = llm.chat.completions.create(
                model=episode.model, messages=messages, tools=[CALCULATE_TOOL]).choices[0].message
            messages.append(message.model_dump(exclude_none=True))  # unchanged: the next call extends it
            answer = message.content or answer
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result(call)})
    return answer


def main() -> int:
    token = os.environ.get("AJET_TOKEN")
    if not token:
        sys.stderr.write("set AJET_TOKEN to the server's client token (printed by `ajet serve`)\n")
        return 2
    max_episodes = int(os.environ.get("AJET_MAX_EPISODES", "0")) or None
    log = os.environ.get("AJET_LOG")
    done = 0
    with EpisodeClient(os.environ.get("AJET_URL", "http://127.0.0.1:8765"), token) as client:
        while max_episodes is None or done < max_episodes:
            episode = client.begin()  # None once the run has ended
            if episode is None:
                break
            try:
                answer = solve(episode)
            except openai.OpenAIError as err:  # counted as failed, never trained on
                client.abort(episode.episode_id, f"{type(err).__name__}: {err}"[:500])
                continue
            if log:
                with open(log, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps({"episode_id": episode.episode_id, "content": answer}) + "\n")
            client.finish(episode.episode_id, metadata={"final_answer": answer})
            done += 1
    sys.stdout.write(f"python agent: {done} episodes finished\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
