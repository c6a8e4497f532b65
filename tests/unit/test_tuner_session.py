"""EpisodeSession: prompt → budget → sample → parse → record, on fakes."""

from __future__ import annotations

import asyncio
import threading

import pytest
from test_tuner_fakes import EOS, make_session

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.tuner.session import (
    ContextBudgetError,
    InvalidRequestError,
    SessionClosedError,
    completion_text,
    resolve_sampling,
)

USER = [{"role": "user", "content": "What is 2+3?"}]
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
TOOL_REPLY = (
    'Let me compute.<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>'
)


def test_text_call_is_recorded_exactly() -> None:
    session, engine, tracker, chat = make_session(["It is 5."])
    result = asyncio.run(session.chat("default", USER))

    assert result.message == {"role": "assistant", "content": "It is 5."}
    assert result.finish_reason == "stop"
    (call,) = tracker.calls
    assert call.prompt_ids == chat.encode(chat.render(USER)) == engine.seen[0][0]
    assert call.completion_ids == chat.encode("It is 5.") + [EOS]
    assert call.completion_logprobs == pytest.approx(
        [-0.01 * (i + 1) for i in range(len(call.completion_ids))]
    )
    assert call.policy_version == 3
    assert call.messages == USER and call.tools is None
    assert call.response_message == result.message
    assert call.trainable and call.role == "default"
    # what the agent received is exactly the decoded completion (minus the final EOS)
    assert chat.decode(call.completion_ids[:-1]) == result.message["content"]
    assert result.usage == {
        "prompt_tokens": len(call.prompt_ids),
        "completion_tokens": len(call.completion_ids),
        "total_tokens": len(call.prompt_ids) + len(call.completion_ids),
    }
    assert session.stats()["tuner/calls"] == 1


def test_rollout_defaults_and_overrides_reach_the_engine() -> None:
    session, engine, _, _ = make_session(["a", "b"])
    asyncio.run(session.chat("default", USER))
    asyncio.run(
        session.chat("default", USER, temperature=0.0, max_tokens=7, seed=11, stop="x", top_k=2)
    )
    first, second = engine.seen[0][1], engine.seen[1][1]
    assert (first.temperature, first.top_p, first.top_k, first.max_tokens) == (0.7, 0.9, 5, 200)
    assert (second.temperature, second.max_tokens, second.seed, second.stop, second.top_k) == (
        0.0,
        7,
        11,
        ["x"],
        2,
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"temperature": 3.0},
        {"temperature": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"top_k": 1.5},
        {"n": 2},
        {"frequency_penalty": 2.5},
        {"frequency_penalty": 0.1},  # the fake engine does not apply penalties
        {"logit_bias": {"x": 1}},
        {"stop": [""]},
        {"temperature": "hot"},
    ],
)
def test_bad_overrides_are_rejected_before_the_engine(overrides: dict) -> None:
    session, engine, tracker, _ = make_session(["never"])
    with pytest.raises(InvalidRequestError):
        asyncio.run(session.chat("default", USER, **overrides))
    assert engine.seen == [] and tracker.calls == []


def test_tool_call_is_parsed_and_finish_reason_is_tool_calls() -> None:
    session, _, tracker, chat = make_session([TOOL_REPLY])
    result = asyncio.run(session.chat("default", USER, TOOLS))
    assert result.finish_reason == "tool_calls" == tracker.calls[0].finish_reason
    assert result.message["content"] == "Let me compute."
    (tc,) = result.message["tool_calls"]
    assert tc["function"]["name"] == "calc" and tc["function"]["arguments"] == '{"expr": "2+3"}'
    assert tracker.calls[0].tools == TOOLS
    assert chat.decode(tracker.calls[0].completion_ids[:-1]) == result.text == TOOL_REPLY
    assert session.stats()["tuner/malformed_tool_calls"] == 0


def test_malformed_tool_call_is_counted_and_kept_as_text() -> None:
    bad = "<tool_call>{not json</tool_call>"
    session, _, _, _ = make_session([bad])
    result = asyncio.run(session.chat("default", USER, TOOLS))
    assert result.message["content"] == bad and "tool_calls" not in result.message
    assert result.malformed_tool_call and result.finish_reason == "stop"
    assert session.stats()["tuner/malformed_tool_calls"] == 1


def test_tool_choice_none_leaves_markup_unparsed() -> None:
    session, _, _, _ = make_session([TOOL_REPLY])
    result = asyncio.run(session.chat("default", USER, TOOLS, tool_choice="none"))
    assert result.message == {"role": "assistant", "content": TOOL_REPLY}
    assert result.finish_reason == "stop"


def test_max_tokens_is_capped_by_the_call_budget_and_counted() -> None:
    session, engine, tracker, _ = make_session(
        ["a long reply"], context=ContextConfig(max_call_tokens=4)
    )
    result = asyncio.run(session.chat("default", USER, max_tokens=50))
    assert engine.seen[0][1].max_tokens == 4
    assert result.capped and result.finish_reason == "length"
    assert len(tracker.calls[0].completion_ids) == 4
    assert session.stats()["tuner/capped_calls"] == 1


def test_prompt_too_long_raises_a_clear_error_and_records_nothing() -> None:
    session, engine, tracker, _ = make_session(["x"], model_max_len=10)
    with pytest.raises(ContextBudgetError, match="Shorten the conversation"):
        asyncio.run(session.chat("default", USER))
    assert engine.seen == [] and tracker.calls == []
    assert session.stats()["tuner/failed_calls"] == 1


def test_the_first_refused_call_of_an_episode_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A CLI harness may retry a refused call quietly or bury the error in its own output: the
    run's log names the first refusal of each episode, and counts the rest."""
    session, engine, _, _ = make_session(["x"], model_max_len=10)
    with caplog.at_level("WARNING", logger="ajet.tuner.session"):
        for _ in range(3):
            with pytest.raises(ContextBudgetError):
                asyncio.run(session.chat("default", USER))
    warnings = [r.getMessage() for r in caplog.records if r.name == "ajet.tuner.session"]
    assert len(warnings) == 1 and "leaves no room for a completion" in warnings[0], warnings
    assert "later refused calls are counted in tuner/failed_calls" in warnings[0]
    assert session.stats()["tuner/failed_calls"] == 3


def test_trainable_follows_the_roles() -> None:
    session, _, tracker, _ = make_session(["a", "b"], trainable_targets={"solver"})
    asyncio.run(session.chat("solver", USER))
    asyncio.run(session.chat("critic", USER))
    assert [(c.role, c.trainable) for c in tracker.calls] == [("solver", True), ("critic", False)]


def test_closed_session_refuses_calls_and_drops_in_flight_ones() -> None:
    session, _, tracker, _ = make_session(["late"], delay_s=0.2)

    async def main() -> None:
        task = asyncio.create_task(session.chat("default", USER))
        await asyncio.sleep(0.05)
        session.close()
        with pytest.raises(SessionClosedError):
            await task
        with pytest.raises(SessionClosedError, match="has ended"):
            await session.chat("default", USER)

    asyncio.run(main())
    assert tracker.calls == []


def test_concurrent_calls_from_threads_and_loops() -> None:
    session, _, tracker, _ = make_session(lambda prompt: "ok", delay_s=0.01)

    def worker(role: str) -> None:
        async def run() -> None:
            await asyncio.gather(*(session.chat(role, USER) for _ in range(10)))

        asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tracker.calls) == 40 and session.stats()["tuner/calls"] == 40
    assert session.counters.per_role_calls == {f"r{i}": 10 for i in range(4)}


def test_stop_string_cuts_the_reply_text() -> None:
    session, _, tracker, chat = make_session(["answer: 5\nObservation: z"])
    result = asyncio.run(session.chat("default", USER, stop=["\nObservation"]))
    assert result.message["content"] == "answer: 5"
    assert chat.decode(tracker.calls[0].completion_ids).startswith(result.message["content"])


def test_resolve_sampling_and_completion_text_are_pure() -> None:
    rollout = RolloutConfig(temperature=1.0, top_p=1.0, top_k=0, max_tokens=256)
    params = resolve_sampling(rollout, {"temperature": None, "max_completion_tokens": 12})
    assert (params.temperature, params.max_tokens) == (1.0, 12)
    assert resolve_sampling(rollout, {}).stop == []

    class Chat:
        eos_token_ids = {0}

        def decode(self, ids: list[int]) -> str:
            return "".join(chr(i) for i in ids)

    assert completion_text(Chat(), [104, 105, 0], []) == "hi"
    assert completion_text(Chat(), [104, 105, 33, 0], ["!", "i"]) == "h"


def test_engine_failures_are_infrastructure_errors_and_rejections_are_not() -> None:
    from ajet.errors import InfrastructureError

    session, engine, tracker, _ = make_session(["x"])
    engine.fail_with = RuntimeError("engine thread died")
    with pytest.raises(InfrastructureError, match="engine thread died"):
        asyncio.run(session.chat("default", USER))
    engine.fail_with = ValueError("prompt too long for the engine")
    with pytest.raises(ValueError, match="prompt too long") as info:
        asyncio.run(session.chat("default", USER))
    assert not isinstance(info.value, InfrastructureError)
    assert tracker.calls == [] and session.stats()["tuner/failed_calls"] == 2


def test_logprobs_are_asked_at_the_rollout_temperature_whatever_the_request() -> None:
    rollout = RolloutConfig(temperature=0.7)
    assert resolve_sampling(rollout, {"temperature": 0.0}).logprob_temperature == 0.7
    assert resolve_sampling(rollout, {"temperature": 1.3}).logprob_temperature == 0.7
    assert resolve_sampling(RolloutConfig(temperature=0.0), {}).logprob_temperature == 1.0


@pytest.mark.parametrize(
    ("tool_choice", "prefix"),
    [
        ("required", '<tool_call>\n{"name": "'),
        ("any", '<tool_call>\n{"name": "'),
        ("calc", '<tool_call>\n{"name": "calc", "arguments": {'),
        ({"type": "function", "function": {"name": "calc"}}, '<tool_call>\n{"name": "calc", "arguments": {'),
    ],
)
def test_tool_choice_forces_the_tool_call_markup(tool_choice: object, prefix: str) -> None:
    rest = TOOL_REPLY[TOOL_REPLY.index("<tool_call>") + len(prefix):]  # what the model writes
    session, engine, tracker, chat = make_session([rest])
    result = asyncio.run(session.chat("default", USER, TOOLS, tool_choice=tool_choice))
    (call,) = tracker.calls
    # the forced start is the end of the prompt (context): the model only writes the rest
    assert engine.seen[0][0] == call.prompt_ids == chat.encode(chat.render(USER, TOOLS) + prefix)
    assert chat.decode(call.completion_ids[:-1]) == rest
    (tc,) = result.message["tool_calls"]
    assert tc["function"]["name"] == "calc" and tc["function"]["arguments"] == '{"expr": "2+3"}'
    assert result.finish_reason == "tool_calls" and result.text == prefix + rest


@pytest.mark.parametrize(
    ("tools", "tool_choice", "message"),
    [
        (TOOLS, "multiply", "names no offered tool"),
        (TOOLS, {"type": "function", "function": {}}, "names no offered tool"),
        (None, "required", "no tools were given"),
    ],
)
def test_impossible_tool_choice_is_rejected_before_the_engine(tools: object, tool_choice: object,
                                                              message: str) -> None:
    session, engine, tracker, _ = make_session(["never"])
    with pytest.raises(InvalidRequestError, match=message):
        asyncio.run(session.chat("default", USER, tools, tool_choice=tool_choice))
    assert engine.seen == [] and tracker.calls == []


def test_first_call_tool_choice_forces_only_each_roles_first_call_with_tools() -> None:
    prefix = '<tool_call>\n{"name": "calc", "arguments": {'
    rest = TOOL_REPLY[TOOL_REPLY.index("<tool_call>") + len(prefix):]
    rollout = RolloutConfig(max_tokens=200, first_call_tool_choice="calc")
    session, engine, tracker, chat = make_session([rest, "It is 5.", "no tools here", rest, "x"],
                                                  rollout=rollout)
    first = asyncio.run(session.chat("default", USER, TOOLS))
    second = asyncio.run(session.chat("default", USER, TOOLS))  # not the first call: left alone
    assert first.message["tool_calls"][0]["function"]["name"] == "calc"
    assert engine.seen[0][0] == chat.encode(chat.render(USER, TOOLS) + prefix)
    assert second.message == {"role": "assistant", "content": "It is 5."}
    assert engine.seen[1][0] == chat.encode(chat.render(USER, TOOLS))
    # a first call without tools is not forced, and does not use up another role's first call
    asyncio.run(session.chat("judge", USER))
    assert engine.seen[2][0] == chat.encode(chat.render(USER, None))
    other = asyncio.run(session.chat("planner", USER, TOOLS))
    assert other.finish_reason == "tool_calls"
    # the workflow's own tool_choice wins
    asyncio.run(session.chat("critic", USER, TOOLS, tool_choice="none"))
    assert engine.seen[4][0] == chat.encode(chat.render(USER, TOOLS))


def test_a_forced_call_starts_as_the_call_renders() -> None:
    from ajet.engine.chat import tool_choice_prefix

    calc = {"type": "function", "function": {"name": "calculate", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
    two = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
    base = '<tool_call>\n{"name": "calculate", "arguments": {'
    assert tool_choice_prefix("calculate", [calc, two]) == base
    assert tool_choice_prefix("required", [calc, two]) == '<tool_call>\n{"name": "'
    # what an assistant's call renders as starts with the forced text: the reply continues it
    import json

    rendered = '<tool_call>\n' + json.dumps({"name": "calculate", "arguments": {"expression": "2 * 3"}})
    assert rendered.startswith(base)


def test_a_forced_call_the_model_leaves_open_in_a_string_is_closed() -> None:
    import json

    tools = [{"type": "function", "function": {"name": "calc", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
    session, engine, tracker, chat = make_session(['"expression": "12 * 3'])
    result = asyncio.run(session.chat("default", USER, tools, tool_choice="calc"))
    (call,) = tracker.calls
    assert chat.decode(call.prompt_ids).endswith('"arguments": {')
    assert [json.loads(c["function"]["arguments"]) for c in result.message["tool_calls"]] == [{"expression": "12 * 3"}]
    assert not result.malformed_tool_call


def test_an_episode_gets_at_most_max_calls_per_episode_calls() -> None:
    """Before (issue 53) an agent in a loop, or a hostile client with one episode key, could
    call the engine without end. Through the gateway the refusal is a 429 naming the setting."""
    from ajet.tuner.session import CallLimitError

    session, engine, tracker, _ = make_session(lambda prompt: "again", rollout=RolloutConfig(max_calls_per_episode=3))
    for _ in range(3):
        asyncio.run(session.chat("default", USER))
    with pytest.raises(CallLimitError, match=r"rollout.max_calls_per_episode=3"):
        asyncio.run(session.chat("default", USER))
    assert len(tracker.calls) == 3 and len(engine.seen) == 3  # the refused call never reached the engine
