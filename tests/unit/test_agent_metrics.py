"""Agent metrics from hand-built tracker records and episodes with known counts."""

from __future__ import annotations

import json

import pytest

from ajet.context.types import LLMCall
from ajet.rollout.agent_metrics import agent_metrics, count_tool_calls
from ajet.rollout.episode import FAILED, Episode
from ajet.rollout.manager import RolloutResult
from ajet.workflow import WorkflowTask

CALC = {"type": "function", "function": {"name": "calculate", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def tool_call(call_id: str, arguments: object, name: str = "calculate") -> dict:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def llm_call(messages: list[dict], reply: dict, tools: list[dict] | None = None) -> LLMCall:
    return LLMCall(role="default", prompt_ids=[1], completion_ids=[2], completion_logprobs=[0.0],
                   finish_reason="stop", policy_version=0, messages=messages,
                   tools=[CALC] if tools is None else tools, response_message=reply)


USER = {"role": "user", "content": "What is 12 * 34?"}


def test_a_react_episode_with_one_good_call() -> None:
    call = tool_call("c1", {"expression": "12 * 34"})
    first = llm_call([USER], {"role": "assistant", "content": None, "tool_calls": [call]})
    result = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "408"}]}
    second = llm_call([USER, first.response_message, result], {"role": "assistant", "content": "\\boxed{408}"})
    assert count_tool_calls([first, second]) == (1, 1)


def test_invalid_calls_are_attempts_but_not_valid() -> None:
    bad_key = tool_call("c1", {"operation": "12 * 34"})  # the schema requires "expression"
    unknown = tool_call("c2", {"expression": "1"}, name="search")  # not a tool of the request
    not_json = tool_call("c3", "{expression: 1")
    failed = tool_call("c4", {"expression": "1 / 0"})
    later = tool_call("c5", {"expression": "2 + 2"})  # its result is never sent back: judged on form
    reply = {"role": "assistant", "content": None, "tool_calls": [bad_key, unknown, not_json, failed]}
    first = llm_call([USER], reply)
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "error: bad"} for i in (1, 2, 3)]
    results.append({"role": "tool", "tool_call_id": "c4", "content": "Error: division by zero"})
    second = llm_call([USER, reply, *results], {"role": "assistant", "content": None, "tool_calls": [later]})
    assert count_tool_calls([first, second]) == (5, 1)


def test_a_malformed_block_counts_as_an_attempt() -> None:
    # The chat format keeps a block it cannot parse verbatim in the content.
    reply = {"role": "assistant", "content": '<tool_call>\n{"name": "calculate", "arguments": {'}
    assert count_tool_calls([llm_call([USER], reply)]) == (1, 0)
    assert count_tool_calls([llm_call([USER], {"role": "assistant", "content": "408"})]) == (0, 0)


def test_a_request_without_tool_specs_accepts_any_name() -> None:
    call = tool_call("c1", {"q": "x"}, name="anything")
    assert count_tool_calls([llm_call([USER], {"role": "assistant", "tool_calls": [call]}, tools=[])]) == (1, 1)


def episode(i: int, *, calls: int, tools: int, valid: int, success: bool, status: str = "ok") -> Episode:
    task = WorkflowTask(task_id=f"t{i}", main_query="q")
    return Episode(episode_id=f"e{i}", task=task, group_id=f"t{i}", status=status, num_calls=calls,
                   tool_calls=tools, valid_tool_calls=valid, is_success=success, reward=float(success))


def test_agent_metrics_known_counts() -> None:
    episodes = [
        episode(0, calls=2, tools=1, valid=1, success=True),   # the tool, right
        episode(1, calls=1, tools=0, valid=0, success=True),   # right without the tool
        episode(2, calls=3, tools=2, valid=0, success=False),  # two bad calls
        episode(3, calls=2, tools=1, valid=1, success=False, status=FAILED),
    ]
    assert agent_metrics(episodes) == pytest.approx({
        "agent/tool_call_rate": 3 / 4,
        "agent/valid_tool_call_rate": 2 / 4,
        "agent/calls_per_episode": 8 / 4,
        "agent/success_with_tool": 1 / 2,
        "rollout/zero_call_episodes": 0.0,
    })


def test_agent_metrics_leave_out_undefined_rates() -> None:
    metrics = agent_metrics([episode(0, calls=1, tools=0, valid=0, success=False)])
    assert metrics == {"agent/tool_call_rate": 0.0, "agent/calls_per_episode": 1.0, "rollout/zero_call_episodes": 0.0}
    assert agent_metrics([]) == {}


def test_rollout_metrics_include_the_agent_metrics() -> None:
    episodes = [episode(0, calls=2, tools=1, valid=1, success=True),
                episode(1, calls=1, tools=0, valid=0, success=False)]
    metrics = RolloutResult(episodes=episodes, ok_episodes=episodes).metrics()
    assert metrics["agent/tool_call_rate"] == 0.5
    assert metrics["agent/success_with_tool"] == 1.0
