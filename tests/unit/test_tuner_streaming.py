"""Token-by-token streaming: what may be sent while a reply is generated, the session's
deltas, and the gateway's SSE stream (OpenAI SDK) on a streaming fake engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from test_tuner_fakes import FakeChat, make_session

from ajet.tuner import Gateway, ModelTuner
from ajet.tuner.streaming import TextStream, rest, settled_text

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALL = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
LONG = "The sum of two and three is five, as anyone can check."


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with Gateway() as gw:
        yield gw


@pytest.mark.parametrize(
    ("text", "stops", "settled", "ended"),
    [
        ("Hello wor", [], "Hello wor", False),
        ("Hello <tool_", [], "Hello", False),  # may become a tool call: held back
        ("Hello <tool_call>\n{", [], "Hello", True),  # became one: the content ends here
        ("Say it ##", ["###"], "Say it", False),  # may become the stop string
        ("Hello  \n", [], "Hello", False),  # trailing whitespace waits
        ("caf\ufffd", [], "caf", False),  # a character still arriving
        ("<tool", [], "", False),
    ],
)
def test_settled_text(text: str, stops: list[str], settled: str, ended: bool) -> None:
    assert settled_text(text, stops) == (settled, ended)


def test_text_stream_sends_only_settled_growth() -> None:
    chat = FakeChat()  # one token per character
    sent: list[str] = []
    stream = TextStream(chat, [], sent.append)
    for token in chat.encode(CALL):
        stream.push(token)
    assert "".join(sent) == "Adding." and stream.ended
    assert all(sent)  # no empty deltas
    assert rest("Adding.", "Adding.") == "" and rest("Add", "Adding.") == "ing." and rest("x", "Adding.") == ""


def test_session_streams_deltas_that_add_up_to_the_reply() -> None:
    session, _, _, _ = make_session([LONG], streaming=True)
    deltas: list[str] = []
    result = asyncio.run(session.chat("default", [{"role": "user", "content": "2+3?"}], on_text=deltas.append))
    assert len(deltas) > 5 and "".join(deltas) == result.message["content"] == LONG


def test_session_does_not_stream_a_forced_tool_call() -> None:
    rest_of_call = CALL[CALL.index("<tool_call>") + len('<tool_call>\n{"name": "add", "arguments": {'):]
    session, _, _, _ = make_session([rest_of_call], streaming=True)
    deltas: list[str] = []
    result = asyncio.run(session.chat("default", [{"role": "user", "content": "2+3?"}], TOOLS,
                                      tool_choice="add", on_text=deltas.append))
    assert deltas == [] and result.message["tool_calls"][0]["function"]["name"] == "add"


def sdk_stream(tuner: ModelTuner, **kwargs: object) -> list:
    async def run() -> list:
        stream = await tuner.openai_client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "2+3?"}], stream=True, **kwargs)
        return [chunk async for chunk in stream]

    return asyncio.run(run())


def test_gateway_streams_text_token_by_token(gateway: Gateway) -> None:
    session, _, tracker, chat = make_session([LONG], streaming=True)
    tuner = ModelTuner(session, gateway=gateway)
    chunks = sdk_stream(tuner, stream_options={"include_usage": True})
    tuner.close()
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) > 5  # many deltas, not one
    assert "".join(contents) == LONG == chat.decode(tracker.calls[0].completion_ids[:-1])
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(tracker.calls[0].completion_ids)


def test_gateway_streams_content_then_the_tool_call(gateway: Gateway) -> None:
    session, _, _, _ = make_session([CALL], streaming=True)
    tuner = ModelTuner(session, gateway=gateway)
    chunks = sdk_stream(tuner, tools=TOOLS)
    tuner.close()
    choices = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.delta.content or "" for c in choices) == "Adding."
    [call] = [tc for c in choices for tc in (c.delta.tool_calls or [])]
    assert call.function.name == "add" and call.function.arguments == '{"a": 2, "b": 3}'
    assert choices[-1].finish_reason == "tool_calls"


def test_gateway_stream_errors_before_the_first_token_are_http_errors(gateway: Gateway) -> None:
    session, engine, _, _ = make_session(["never"], streaming=True)
    tuner = ModelTuner(session, gateway=gateway)
    with pytest.raises(openai.BadRequestError, match="names no offered tool"):
        sdk_stream(tuner, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "mul"}})
    tuner.close()
    assert engine.seen == []
