"""`ajet eval --dialogs`: an episode becomes the SFT dialog of its last call per role."""

from __future__ import annotations

from ajet.context.types import LLMCall
from ajet.eval.dialogs import episode_dialogs
from ajet.sft.data import dialog_from_row

TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]


def call(index: int, role: str, messages: list[dict], reply: dict) -> LLMCall:
    return LLMCall(role=role, prompt_ids=[1], completion_ids=[2], completion_logprobs=[-1.0], finish_reason="stop",
                   policy_version=0, messages=messages, tools=TOOLS, response_message=reply, call_index=index)


def test_the_last_call_of_each_role_with_its_reply_is_the_dialog() -> None:
    user = {"role": "user", "content": "3 * 4?"}
    tool_call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "3 * 4"}'}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "12"}
    calls = [
        call(1, "solver", [user, tool_call, result], {"role": "assistant", "content": "\\\\boxed{12}", "extra": 1}),
        call(0, "solver", [user], tool_call),
        call(2, "critic", [{"role": "user", "content": "ok?"}], {"role": "assistant", "content": "yes"}),
    ]
    rows = episode_dialogs("ep7", calls)
    assert [row["id"] for row in rows] == ["ep7-solver", "ep7-critic"]
    solver = dialog_from_row(rows[0], "x")
    assert solver.messages == [user, tool_call, result, {"role": "assistant", "content": "\\\\boxed{12}"}]
    assert solver.tools == TOOLS
    assert dialog_from_row(rows[1], "x").messages[-1]["content"] == "yes"
    # One role: the dialog is named by the episode.
    assert [r["id"] for r in episode_dialogs("ep8", calls[:2])] == ["ep8"]
