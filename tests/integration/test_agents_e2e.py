"""Three kinds of agents complete an episode against the bundled model, and every
recorded call is exactly what the agent received.

- an AgentScope `ReActAgent` with the tuner as its model and one Python tool,
- an `openai.AsyncOpenAI` agent with tools (a manual tool loop of 2 turns),
- a raw `httpx` agent.

Greedy decoding and few tokens keep it deterministic and short. The 135M model does
not call tools reliably; the tool path is covered deterministically by the unit tests
(scripted engine); here the point is that episodes complete and the records are exact.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ajet.config.schema import ContextConfig, ModelConfig, RolloutConfig
from ajet.engine.base import EngineFeatures

pytestmark = pytest.mark.integration

ROLLOUT = RolloutConfig(temperature=0.0, top_p=1.0, top_k=0, max_tokens=32, episode_timeout_s=120)
CONTEXT = ContextConfig(max_call_tokens=48)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers and return the sum.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
SYSTEM = "You are a careful assistant. Use the add tool for arithmetic."
QUESTION = "What is 17 + 25?"


@pytest.fixture(scope="module")
def stack(bundled_model_dir: Path) -> Iterator[dict[str, Any]]:
    from ajet.engine.chat import ChatFormat
    from ajet.engine.local import LocalEngine
    from ajet.models.load import load_model_and_tokenizer
    from ajet.tuner import Gateway

    model, tokenizer = load_model_and_tokenizer(
        ModelConfig(path=str(bundled_model_dir), device="cpu")
    )
    engine = LocalEngine(model, tokenizer, max_batch_size=4, max_model_len=2048)
    gateway = Gateway().start()
    try:
        yield {"engine": engine, "chat": ChatFormat(tokenizer), "gateway": gateway}
    finally:
        gateway.stop()
        engine.close()


def open_episode(stack: dict[str, Any], episode_id: str, tuner_cls: type | None = None):
    from ajet.context.tracker import ContextTracker
    from ajet.tuner import EpisodeSession, ModelTuner

    tracker = ContextTracker(stack["chat"], None, CONTEXT)
    session = EpisodeSession(
        episode_id, stack["engine"], stack["chat"], tracker, ROLLOUT, CONTEXT, None, 2048
    )
    tuner = (tuner_cls or ModelTuner)(session, gateway=stack["gateway"])
    return tuner, tracker


def strip_eos(chat: Any, ids: list[int]) -> list[int]:
    ids = list(ids)
    while ids and ids[-1] in chat.eos_token_ids:
        ids.pop()
    return ids


def _tool_calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (t["function"]["name"], json.loads(t["function"]["arguments"]))
        for t in message.get("tool_calls") or []
    ]


def assert_exact(chat: Any, tracker: Any, received: list[dict[str, Any]]) -> None:
    """Each recorded call decodes to exactly what its agent received, and its prompt
    ids decode to the rendered prompt."""
    assert len(tracker.calls) == len(received) >= 1
    for call, got in zip(tracker.calls, received, strict=True):
        rendered = chat.render(call.messages, call.tools, add_generation_prompt=True)
        prompt_text = chat.decode(call.prompt_ids)
        assert prompt_text.startswith(rendered)
        # a start forced by tool_choice ends the prompt (ajet.engine.chat.tool_choice_prefix)
        forced = prompt_text[len(rendered):]
        assert forced == "" or re.fullmatch(r'<tool_call>\n\{"name": ("|"[^"]+", "arguments": \{)', forced), forced
        generated = forced + chat.decode(strip_eos(chat, call.completion_ids))
        expected = chat.to_openai_message(chat.parse_completion(generated))
        for message in (expected, call.response_message):
            assert (got.get("content") or "") == (message.get("content") or "")
            assert _tool_calls(got) == _tool_calls(message)
        if not got.get("tool_calls"):  # plain text: the very same string
            assert got.get("content") == generated
        assert len(call.completion_logprobs) == len(call.completion_ids) > 0
        if not call.fork_cause:  # an extension: the earlier prompt + completion, token for token
            parent = [
                c
                for c in tracker.calls
                if c.call_index < call.call_index and c.timeline_id == call.timeline_id
            ][-1]
            head = parent.prompt_ids + parent.completion_ids
            assert call.prompt_ids[: len(head)] == head


def test_react_agent_episode(stack: dict[str, Any]) -> None:
    from agentscope.agent import ReActAgent
    from agentscope.formatter import OpenAIChatFormatter
    from agentscope.message import Msg, TextBlock
    from agentscope.tool import Toolkit, ToolResponse

    from ajet.tuner import ModelTuner

    received: list[dict[str, Any]] = []

    class Capturing(ModelTuner):
        async def __call__(self, *args: Any, **kwargs: Any) -> Any:
            response = await super().__call__(*args, **kwargs)
            text = "".join(b["text"] for b in response.content if b["type"] == "text")
            calls = [
                {"function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
                for b in response.content
                if b["type"] == "tool_use"
            ]
            received.append({"content": text or None, **({"tool_calls": calls} if calls else {})})
            return response

    def add(a: int, b: int) -> ToolResponse:
        """Add two integers and return the sum.

        Args:
            a (int): the first integer
            b (int): the second integer
        """
        return ToolResponse(content=[TextBlock(type="text", text=str(a + b))])

    tuner, tracker = open_episode(stack, "react-e0", Capturing)
    toolkit = Toolkit()
    toolkit.register_tool_function(add)
    agent = ReActAgent(
        name="solver",
        sys_prompt=SYSTEM,
        model=tuner,
        formatter=OpenAIChatFormatter(),
        toolkit=toolkit,
        max_iters=2,
    )
    agent.set_console_output_enabled(False)
    reply = asyncio.run(asyncio.wait_for(agent(Msg("user", QUESTION, "user")), 300))
    tuner.close()

    assert reply.role == "assistant"
    assert_exact(stack["chat"], tracker, received)
    assert all(c.tools and c.tools[0]["function"]["name"] == "add" for c in tracker.calls[:1])


def test_openai_sdk_agent_two_turn_tool_loop(stack: dict[str, Any]) -> None:
    tuner, tracker = open_episode(stack, "openai-e0")
    received: list[dict[str, Any]] = []

    async def agent() -> None:
        client = tuner.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        for _ in range(2):
            r = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=32
            )
            msg = r.choices[0].message.model_dump(exclude_none=True)
            received.append(msg)
            messages.append(msg)
            for tc in msg.get("tool_calls") or []:
                try:
                    args = json.loads(tc["function"]["arguments"])
                    result = str(int(args["a"]) + int(args["b"]))
                except (KeyError, ValueError, TypeError) as err:
                    result = f"error: {err}"
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
            if not msg.get("tool_calls"):
                messages.append({"role": "user", "content": "Please check your answer."})

    asyncio.run(asyncio.wait_for(agent(), 300))
    tuner.close()
    assert len(received) == 2
    assert_exact(stack["chat"], tracker, received)
    assert tracker.calls[1].messages[: len(tracker.calls[0].messages)] == tracker.calls[0].messages


def test_raw_httpx_agent(stack: dict[str, Any]) -> None:
    import httpx

    tuner, tracker = open_episode(stack, "httpx-e0")
    base_url, key = tuner.base_url_and_key("default")
    received: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Name a colour."}]
    with httpx.Client(timeout=300) as client:
        for follow_up in ("And another one?", None):
            r = client.post(
                f"{base_url}/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "policy", "messages": messages, "max_tokens": 24},
            )
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
            received.append({k: v for k, v in msg.items() if v is not None})
            messages.append(msg)
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
    tuner.close()
    assert_exact(stack["chat"], tracker, received)
    # the second call extends the first: one timeline, history never re-tokenized
    assert tracker.calls[1].fork_cause == ""
    assert len(tracker.timelines()) == 1


# -- the tool path, deterministically: the real tokenizer, chat format and tracker, with
# -- an engine that replays scripted replies as bundled-tokenizer token ids.

TOOL_REPLY = (
    'I will add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
)


class ScriptedEngine(EngineFeatures):
    def __init__(self, chat: Any, replies: list[str]) -> None:
        self.chat, self.replies, self.policy_version = chat, list(replies), 0

    async def generate(self, prompt_ids: list[int], params: Any) -> list[Any]:
        from ajet.engine.base import Completion

        text = self.replies.pop(0)
        ids = self.chat.encode(text) + [min(self.chat.eos_token_ids)]
        return [Completion(ids, [-0.5] * len(ids), "stop", self.policy_version, text)]


@pytest.fixture(scope="module")
def scripted(bundled_model_dir: Path) -> Iterator[dict[str, Any]]:
    from transformers import AutoTokenizer

    from ajet.engine.chat import ChatFormat
    from ajet.tuner import Gateway

    chat = ChatFormat(AutoTokenizer.from_pretrained(bundled_model_dir))
    with Gateway() as gateway:
        yield {"chat": chat, "gateway": gateway}


def test_scripted_react_tool_path_is_one_exact_timeline(scripted: dict[str, Any]) -> None:
    from agentscope.agent import ReActAgent
    from agentscope.formatter import OpenAIChatFormatter
    from agentscope.message import Msg, TextBlock
    from agentscope.tool import Toolkit, ToolResponse

    seen: list[dict[str, int]] = []

    def add(a: int, b: int) -> ToolResponse:
        """Add two integers and return the sum.

        Args:
            a (int): the first integer
            b (int): the second integer
        """
        seen.append({"a": a, "b": b})
        return ToolResponse(content=[TextBlock(type="text", text=str(a + b))])

    engine = ScriptedEngine(scripted["chat"], [TOOL_REPLY, "The answer is 42."])
    tuner, tracker = open_episode({**scripted, "engine": engine}, "react-scripted")
    toolkit = Toolkit()
    toolkit.register_tool_function(add)
    agent = ReActAgent(
        name="solver",
        sys_prompt=SYSTEM,
        model=tuner,
        formatter=OpenAIChatFormatter(),
        toolkit=toolkit,
    )
    agent.set_console_output_enabled(False)
    reply = asyncio.run(agent(Msg("user", QUESTION, "user")))
    tuner.close()

    assert reply.get_text_content() == "The answer is 42." and seen == [{"a": 17, "b": 25}]
    received = [c.response_message for c in tracker.calls]
    assert_exact(scripted["chat"], tracker, received)
    assert [c.fork_cause for c in tracker.calls] == ["first_call", ""]
    assert tracker.calls[0].finish_reason == "tool_calls" and len(tracker.timelines()) == 1


def test_scripted_openai_tool_loop_streaming_is_one_exact_timeline(
    scripted: dict[str, Any],
) -> None:
    engine = ScriptedEngine(scripted["chat"], [TOOL_REPLY, "The answer is 42."])
    tuner, tracker = open_episode({**scripted, "engine": engine}, "openai-scripted")
    received: list[dict[str, Any]] = []

    async def agent() -> None:
        client = tuner.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        for _ in range(2):
            stream = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, stream=True
            )
            content, calls = "", {}
            async for chunk in stream:
                delta = chunk.choices[0].delta
                content += delta.content or ""
                for tc in delta.tool_calls or []:
                    entry = calls.setdefault(
                        tc.index,
                        {
                            "id": tc.id,
                            "type": "function",
                            "function": {"name": tc.function.name, "arguments": ""},
                        },
                    )
                    entry["function"]["arguments"] += tc.function.arguments or ""
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [calls[i] for i in sorted(calls)]
            received.append(msg)
            messages.append(msg)
            for tc in msg.get("tool_calls") or []:
                args = json.loads(tc["function"]["arguments"])
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tc["id"],
                        "content": str(args["a"] + args["b"]),
                    }
                )

    asyncio.run(agent())
    tuner.close()
    assert received[1]["content"] == "The answer is 42."
    assert_exact(scripted["chat"], tracker, received)
    assert [c.fork_cause for c in tracker.calls] == ["first_call", ""]
    assert len(tracker.timelines()) == 1


def test_react_agent_with_structured_output_finishes(stack: dict[str, Any]) -> None:
    """Structured output goes through a `generate_response` tool with tool_choice="required",
    which the small model may ignore: the agent must still finish (hints, then a summary)."""
    from agentscope.agent import ReActAgent
    from agentscope.formatter import OpenAIChatFormatter
    from agentscope.message import Msg
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int

    tuner, tracker = open_episode(stack, "react-structured-e0")
    agent = ReActAgent(
        name="solver", sys_prompt=SYSTEM, model=tuner, formatter=OpenAIChatFormatter(), max_iters=2
    )
    agent.set_console_output_enabled(False)
    reply = asyncio.run(
        asyncio.wait_for(agent(Msg("user", QUESTION, "user"), structured_model=Answer), 300)
    )
    tuner.close()

    assert reply.role == "assistant"
    assert (
        1 <= len(tracker.calls) <= 3
    )  # max_iters reasoning calls, plus a summary if none finished
    assert_exact(stack["chat"], tracker, [c.response_message for c in tracker.calls])
    assert tracker.calls[0].tools[0]["function"]["name"] == "generate_response"


def test_openai_stream_on_the_local_engine_is_token_by_token_and_exact(stack: dict[str, Any]) -> None:
    tuner, tracker = open_episode(stack, "openai-stream-e0")

    async def agent() -> list[str]:
        stream = await tuner.openai_client().chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Describe the sea in two sentences."}],
            stream=True, max_tokens=40, temperature=0.8, seed=3)
        return [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]

    deltas = asyncio.run(agent())
    tuner.close()
    (call,) = tracker.calls
    assert len(deltas) > 3  # streamed as it was sampled, not in one piece
    assert "".join(deltas) == call.response_message["content"]
    assert_exact(stack["chat"], tracker, [call.response_message])
