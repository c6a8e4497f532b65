"""The OpenAI SDK against the gateway: tools, a manual tool loop, streaming, roles."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from test_tuner_fakes import make_session

from ajet.tuner import Gateway, ModelTuner
from ajet.tuner.openai_compat import stream_chunks

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
CALL = 'Adding.<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    gw = Gateway().start()
    yield gw
    gw.stop()


def test_manual_tool_loop_with_the_openai_sdk(gateway: Gateway) -> None:
    session, _, tracker, chat = make_session([CALL, "The sum is 5."])
    tuner = ModelTuner(session, gateway=gateway)

    async def agent() -> str:
        client = tuner.openai_client()
        messages = [{"role": "user", "content": "What is 2+3?"}]
        for _ in range(2):
            r = await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS, temperature=0
            )
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                return msg.content
            assert r.choices[0].finish_reason == "tool_calls"
            for tc in msg.tool_calls:
                args = json.loads(tc.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": tc.id, "content": str(args["a"] + args["b"])}
                )
        return ""

    assert asyncio.run(agent()) == "The sum is 5."
    first, second = tracker.calls
    assert first.response_message["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert (
        second.messages[1]["tool_calls"][0]["id"] == first.response_message["tool_calls"][0]["id"]
    )
    assert second.messages[2] == {
        "role": "tool",
        "tool_call_id": second.messages[1]["tool_calls"][0]["id"],
        "content": "5",
    }
    assert [chat.decode(c.completion_ids[:-1]) for c in tracker.calls] == [CALL, "The sum is 5."]
    assert all(c.role == "default" and c.trainable for c in tracker.calls)
    assert tracker.calls[0].tools == TOOLS
    tuner.close()
    assert gateway.unregister_session(session) == 0  # tuner.close() dropped its keys


def test_streaming_text_and_usage(gateway: Gateway) -> None:
    session, _, tracker, _ = make_session(["Hello there."])
    tuner = ModelTuner(session, gateway=gateway)

    async def run() -> tuple[str, list]:
        client = tuner.openai_client()
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks

    text, chunks = asyncio.run(run())
    assert text == "Hello there."
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(tracker.calls[0].completion_ids)
    tuner.close()


def test_streaming_tool_calls(gateway: Gateway) -> None:
    session, _, tracker, _ = make_session([CALL])
    tuner = ModelTuner(session, gateway=gateway)

    async def run() -> tuple[str, dict, str]:
        stream = await tuner.openai_client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "2+3?"}], tools=TOOLS, stream=True
        )
        text, calls, finish = "", {}, ""
        async for chunk in stream:
            choice = chunk.choices[0]
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(
                    tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""}
                )
                entry["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
        return text, calls, finish

    text, calls, finish = asyncio.run(run())
    expected = tracker.calls[0].response_message["tool_calls"][0]
    assert text == "Adding." and finish == "tool_calls"
    assert calls == {0: {"id": expected["id"], "name": "add", "arguments": '{"a": 2, "b": 3}'}}
    tuner.close()


def test_raw_http_per_role_keys_record_roles(gateway: Gateway) -> None:
    session, _, tracker, _ = make_session(["a", "b"], trainable_targets={"solver"})
    tuner = ModelTuner(session, gateway=gateway, trainable_targets=["solver"])
    for role in ("solver", "critic"):
        base_url, key = tuner.base_url_and_key(role)
        assert tuner.base_url_and_key(role) == (base_url, key)  # one key per role and episode
        r = httpx.post(
            f"{base_url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"messages": [{"role": "user", "content": role}]},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert [(c.role, c.trainable) for c in tracker.calls] == [("solver", True), ("critic", False)]
    _, key = tuner.base_url_and_key("solver")
    tuner.close()
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"messages": [{"role": "user", "content": "late"}]},
        timeout=30,
    )
    assert r.status_code == 401 and len(tracker.calls) == 2


def test_stream_chunks_shape() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    chunks = stream_chunks(
        message,
        "tool_calls",
        {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        model="m",
        completion_id="x",
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 3
    assert len({c["id"] for c in chunks}) == 1
