"""Agent metrics: how episodes use their tools, for any workflow (see docs/outputs.md).

Computed from what the tracker recorded (`LLMCall`s), never from the workflow's own
reporting, so an AgentScope agent, an OpenAI-SDK loop and a raw-HTTP agent are counted
alike. Two pure steps:

- `count_tool_calls(calls)` — per episode, when the runner collects its tracker: the tool
  calls the model *attempted* and the ones that were *valid*.
- `agent_metrics(episodes)` — per step, over the episodes' counts:

| metric | meaning |
|---|---|
| `agent/tool_call_rate` | episodes with >= 1 attempted tool call / episodes |
| `agent/valid_tool_call_rate` | valid calls / attempted calls (absent without attempts) |
| `agent/calls_per_episode` | LLM calls per episode |
| `agent/success_with_tool` | successful episodes with >= 1 valid call / successful episodes (absent without successes) |
| `agent/tool_offer_rate` | episodes with >= 1 call that offered tools / episodes (absent when none did: not a tool task) |
| `rollout/zero_call_episodes` | episodes that made no LLM call (a framework's response cache, refused calls): nothing of them is trained |
| `gateway/refused/<field>` | calls refused for that field, summed over the episodes (`Episode.refused`) |

An attempt is a call the engine parsed (`response_message.tool_calls`) or a tool-call block it
could not parse (the chat format keeps a malformed `<tool_call>` block verbatim in the
content). A parsed call is valid when it names a tool of the request, its arguments are a
JSON object holding the schema's required keys, and its result — the `tool` message with its
`tool_call_id` in a later request of the episode — does not start with "error" (how
AgentScope's toolkit and the tutorials report a failed tool run). A call whose result the
episode never sent back (its last turn) is judged on the first two conditions alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

# What the engine's chat format leaves in the content for a tool call it could not parse.
MALFORMED_MARK = "<tool_call>"


def count_tool_calls(calls: Sequence[Any]) -> tuple[int, int]:
    """(attempted, valid) tool calls over one episode's recorded `LLMCall`s."""
    results = _tool_results(calls)
    attempted = valid = 0
    for call in calls:
        message = getattr(call, "response_message", None) or {}
        attempted += str(message.get("content") or "").count(MALFORMED_MARK)
        specs = _specs_by_name(getattr(call, "tools", None))
        for tool_call in message.get("tool_calls") or []:
            attempted += 1
            result = results.get(str(tool_call.get("id", "")))
            valid += _well_formed(tool_call, specs) and not _is_error(result)
    return attempted, valid


def agent_metrics(episodes: Iterable[Any]) -> dict[str, float]:
    """The `agent/*` metrics of a step (see the module docstring); {} without episodes.

    Reads `num_calls`, `tool_calls`, `valid_tool_calls`, `offered_tools`, `refused` and `is_success`
    of each `Episode` (the runner fills the counts from `count_tool_calls`)."""
    episodes = list(episodes)
    if not episodes:
        return {}
    n = len(episodes)
    attempted = sum(e.tool_calls for e in episodes)
    out = {
        "agent/tool_call_rate": sum(e.tool_calls > 0 for e in episodes) / n,
        "agent/calls_per_episode": sum(e.num_calls for e in episodes) / n,
    }
    if attempted:
        out["agent/valid_tool_call_rate"] = sum(e.valid_tool_calls for e in episodes) / attempted
    successes = [e for e in episodes if e.is_success]
    if successes:
        out["agent/success_with_tool"] = sum(e.valid_tool_calls > 0 for e in successes) / len(successes)
    offered = sum(bool(e.offered_tools) for e in episodes)
    if offered:
        out["agent/tool_offer_rate"] = offered / n
    out["rollout/zero_call_episodes"] = float(sum(e.num_calls == 0 for e in episodes))
    for e in episodes:
        for name, count in e.refused.items():
            out[f"gateway/refused/{name}"] = out.get(f"gateway/refused/{name}", 0.0) + count
    return out


def _tool_results(calls: Sequence[Any]) -> dict[str, str]:
    """tool_call_id -> the text of its result, from the `tool` messages the calls sent."""
    out: dict[str, str] = {}
    for call in calls:
        for message in getattr(call, "messages", None) or []:
            if message.get("role") == "tool" and message.get("tool_call_id"):
                out[str(message["tool_call_id"])] = _text(message.get("content"))
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):  # content blocks (AgentScope's formatter, multimodal clients)
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "" if content is None else str(content)


def _specs_by_name(tools: list[dict] | None) -> dict[str, dict]:
    specs = {}
    for tool in tools or []:
        function = tool.get("function", tool)
        if function.get("name"):
            specs[str(function["name"])] = function.get("parameters") or {}
    return specs


def _well_formed(tool_call: dict, specs: dict[str, dict]) -> bool:
    """Names a tool of the request (when it sent specs) with JSON-object arguments holding
    the schema's required keys."""
    function = tool_call.get("function", tool_call)
    name = function.get("name")
    if specs and name not in specs:
        return False
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return False
    if not isinstance(arguments, dict):
        return False
    required = (specs.get(name) or {}).get("required") or []
    return all(key in arguments for key in required)


def _is_error(result: str | None) -> bool:
    return result is not None and result.strip().lower().startswith("error")
