"""The session with the real ContextTracker: the replies the agents send back (AgentScope
formatter, OpenAI SDK) let the tracker extend the timeline token for token."""

from __future__ import annotations

import asyncio
import json

from test_tuner_fakes import FakeChat, FakeEngine
from test_tuner_model import _react_agent

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.context.tracker import ContextTracker
from ajet.tuner import EpisodeSession, Gateway, ModelTuner

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def real_tracker_session(script: list[str]) -> tuple[EpisodeSession, ContextTracker]:
    chat = FakeChat()
    tracker = ContextTracker(chat, None, ContextConfig())
    engine = FakeEngine(chat, script)
    session = EpisodeSession(
        "e0", engine, chat, tracker, RolloutConfig(max_tokens=200), ContextConfig(), None, 4096
    )
    return session, tracker


def assert_one_extended_timeline(tracker: ContextTracker) -> None:
    first, second = tracker.calls
    assert (first.fork_cause, second.fork_cause) == ("first_call", "")
    head = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[: len(head)] == head
    (timeline,) = tracker.timelines()
    assert timeline.token_ids == second.prompt_ids + second.completion_ids
    assert sum(timeline.trainable) == len(first.completion_ids) + len(second.completion_ids)


def test_react_agent_calls_extend_one_timeline() -> None:
    from agentscope.message import Msg

    session, tracker = real_tracker_session([CALL, "It is 5."])
    agent = _react_agent(ModelTuner(session), [])
    reply = asyncio.run(agent(Msg("user", "2+3?", "user")))
    assert reply.get_text_content() == "It is 5."
    assert_one_extended_timeline(tracker)


def test_openai_sdk_tool_loop_extends_one_timeline() -> None:
    session, tracker = real_tracker_session([CALL, "It is 5."])
    with Gateway() as gateway:
        tuner = ModelTuner(session, gateway=gateway)

        async def agent() -> None:
            client = tuner.openai_client()
            messages = [{"role": "user", "content": "2+3?"}]
            r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            args = json.loads(msg.tool_calls[0].function.arguments)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": msg.tool_calls[0].id,
                    "content": str(args["a"] + args["b"]),
                }
            )
            await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)

        asyncio.run(agent())
        tuner.close()
    assert_one_extended_timeline(tracker)


def test_forced_tool_choice_extends_one_timeline_and_trains_only_what_was_sampled() -> None:
    prefix = '<tool_call>\n{"name": "add", "arguments": {'
    session, tracker = real_tracker_session([CALL[len(prefix):], "It is 5."])
    with Gateway() as gateway:
        tuner = ModelTuner(session, gateway=gateway)

        async def agent() -> None:
            client = tuner.openai_client()
            messages = [{"role": "user", "content": "2+3?"}]
            r = await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "add"}})
            msg = r.choices[0].message
            assert msg.tool_calls[0].function.name == "add"
            messages.append(msg.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"})
            await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)

        asyncio.run(agent())
        tuner.close()
    first = tracker.calls[0]
    assert session.chat_format.decode(first.prompt_ids).endswith("<|im_start|>assistant\n" + prefix)
    assert_one_extended_timeline(tracker)  # trainable = the two completions, not the forced start
