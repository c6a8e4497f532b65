"""`ajet episode`'s lines for a call's messages: tool calls in the OpenAI shape show their name
and arguments; a workflow's malformed ones show too, instead of ending the display."""

from __future__ import annotations

from ajet.cli.episode import _content, _tool_calls


def test_tool_calls_in_the_openai_shape_show_name_and_arguments() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "done"}}]}
    assert _tool_calls(message) == [("add", '{"a": 1}'), ("done", "")]
    assert _tool_calls({"role": "user", "content": "hi"}) == []


def test_malformed_tool_calls_show_instead_of_failing() -> None:
    assert _tool_calls({"tool_calls": ["add(1)", {"function": None}, {"id": "x"}]}) == [(None, "")] * 3
    assert _tool_calls({"tool_calls": "add(1)"}) == []


def test_content_is_the_text_of_its_blocks() -> None:
    assert _content({"content": [{"type": "text", "text": "a"}, {"type": "image_url"}, "b", {"text": "c"}]}) == "ac"
    assert _content({"content": None}) == "" and _content({"content": "plain"}) == "plain"
