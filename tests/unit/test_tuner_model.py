"""ModelTuner as an AgentScope chat model, its role routing, and a ReActAgent run on a
scripted engine (the tool path deterministically)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel
from test_tuner_fakes import make_session

from ajet.tuner import ModelTuner, RoleNotRegisteredError

AS_MESSAGES = [  # what agentscope's OpenAIChatFormatter sends
    {"role": "system", "name": "system", "content": [{"type": "text", "text": "You are helpful."}]},
    {"role": "user", "name": "user", "content": [{"type": "text", "text": "What is 2+3?"}]},
]
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


def tool_call(name: str, args: dict, text: str = "") -> str:
    return text + "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_text_reply_is_a_chat_response() -> None:
    session, _, tracker, _ = make_session(["It is 5."])
    tuner = ModelTuner(session)
    response = asyncio.run(tuner(AS_MESSAGES))
    assert [dict(b) for b in response.content] == [{"type": "text", "text": "It is 5."}]
    assert response.usage.input_tokens == len(tracker.calls[0].prompt_ids)
    assert response.usage.output_tokens == len(tracker.calls[0].completion_ids)
    assert tracker.calls[0].messages == AS_MESSAGES
    assert tuner.stream is False


def test_tool_call_reply_gives_tool_use_blocks() -> None:
    session, _, tracker, _ = make_session([tool_call("add", {"a": 2, "b": 3}, "Adding.")])
    response = asyncio.run(ModelTuner(session)(AS_MESSAGES, tools=TOOLS, tool_choice="auto"))
    text, use = response.content
    assert text == {"type": "text", "text": "Adding."}
    assert use["type"] == "tool_use" and use["name"] == "add" and use["input"] == {"a": 2, "b": 3}
    assert use["id"] == tracker.calls[0].response_message["tool_calls"][0]["id"]
    assert tracker.calls[0].tools == TOOLS


def test_sampling_kwargs_pass_through_and_unknown_ones_fail() -> None:
    session, engine, _, _ = make_session(["a"])
    asyncio.run(ModelTuner(session)(AS_MESSAGES, temperature=0.0, max_tokens=9))
    assert (engine.seen[0][1].temperature, engine.seen[0][1].max_tokens) == (0.0, 9)
    with pytest.raises(ValueError, match="unsupported sampling parameter"):
        asyncio.run(ModelTuner(session)(AS_MESSAGES, repetition_penalty=1.1))


def test_invalid_tool_choice_is_rejected() -> None:
    session, engine, _, _ = make_session(["a"])
    with pytest.raises(ValueError, match="Invalid tool_choice"):
        asyncio.run(ModelTuner(session)(AS_MESSAGES, tools=TOOLS, tool_choice="multiply"))
    assert engine.seen == []


class Answer(BaseModel):
    value: int


def forced(reply: str, prefix: str) -> str:
    """What the model writes of `reply` after the start that tool_choice forces."""
    assert reply.startswith(prefix)
    return reply[len(prefix):]


NAMED = '<tool_call>\n{"name": "generate_structured_output", "arguments": {'  # structured_model's forced start


def test_structured_model_uses_a_tool_and_fills_metadata() -> None:
    session, _, tracker, _ = make_session([forced(tool_call("generate_structured_output", {"value": 5}), NAMED)])
    response = asyncio.run(ModelTuner(session)(AS_MESSAGES, tools=TOOLS, structured_model=Answer))
    assert response.metadata == {"value": 5}
    (spec,) = tracker.calls[0].tools  # the request's tools are replaced by the schema tool
    assert spec["function"]["name"] == "generate_structured_output"
    assert "value" in spec["function"]["parameters"]["properties"]


def test_structured_model_closes_an_unclosed_forced_call() -> None:
    # the model stops after the arguments (EOS) without the `}`s and `</tool_call>`: closed for it
    session, _, tracker, chat = make_session(['"value": 7', '"value": 8}', "no json here"])
    tuner = ModelTuner(session)
    assert asyncio.run(tuner(AS_MESSAGES, structured_model=Answer)).metadata == {"value": 7}
    assert asyncio.run(tuner(AS_MESSAGES, structured_model=Answer)).metadata == {"value": 8}
    assert chat.decode(tracker.calls[0].completion_ids[:-1]) == '"value": 7'  # recorded as sampled
    response = asyncio.run(tuner(AS_MESSAGES, structured_model=Answer))
    assert response.metadata is None and session.stats()["tuner/malformed_tool_calls"] == 1


def test_roles_route_to_tuners_or_default_models() -> None:
    session, _, tracker, _ = make_session(["s", "c"], trainable_targets={"solver"})
    tuner = ModelTuner(session, trainable_targets=["solver"])
    sentinel = object()
    solver = tuner.register_model("solver", default_model=sentinel)
    assert isinstance(solver, ModelTuner) and solver.role == "solver" and solver.trainable
    assert tuner.register_model("judge", default_model=sentinel) is sentinel
    critic = tuner.register_model("critic")  # no default model: local engine, context only
    assert isinstance(critic, ModelTuner) and not critic.trainable
    assert tuner.get_model("solver") is solver and solver.get_model("judge") is sentinel
    assert tuner.get_model("default") is tuner

    asyncio.run(solver(AS_MESSAGES))
    asyncio.run(critic(AS_MESSAGES))
    assert [(c.role, c.trainable) for c in tracker.calls] == [("solver", True), ("critic", False)]

    with pytest.raises(
        RoleNotRegisteredError,
        match=r"'planner' is not registered.*\['critic', 'default', 'judge', 'solver'\]",
    ):
        tuner.get_model("planner")


def test_all_roles_trainable_without_targets() -> None:
    session, _, _, _ = make_session([])
    tuner = ModelTuner(session)
    assert isinstance(tuner.register_model("anyone", default_model=object()), ModelTuner)


def test_targets_must_match_the_session() -> None:
    session, _, _, _ = make_session([], trainable_targets={"a"})
    with pytest.raises(ValueError, match="disagree"):
        ModelTuner(session, trainable_targets=["b"])


def test_openai_access_needs_a_gateway() -> None:
    session, _, _, _ = make_session([])
    with pytest.raises(RuntimeError, match="no gateway"):
        ModelTuner(session).base_url_and_key()


def test_close_kills_the_model() -> None:
    session, _, _, _ = make_session(["a"])
    tuner = ModelTuner(session)
    tuner.close()
    with pytest.raises(Exception, match="has ended"):
        asyncio.run(tuner(AS_MESSAGES))


def _react_agent(tuner: ModelTuner, calls: list[dict], formatter: str = "openai"):
    from agentscope.agent import ReActAgent
    from agentscope.formatter import DashScopeChatFormatter, OpenAIChatFormatter
    from agentscope.message import TextBlock
    from agentscope.tool import Toolkit, ToolResponse

    def add(a: int, b: int) -> ToolResponse:
        """Add two integers.

        Args:
            a (int): the first number
            b (int): the second number
        """
        calls.append({"a": a, "b": b})
        return ToolResponse(content=[TextBlock(type="text", text=str(a + b))])

    toolkit = Toolkit()
    toolkit.register_tool_function(add)
    agent = ReActAgent(
        name="solver",
        sys_prompt="Solve it.",
        model=tuner,
        formatter=OpenAIChatFormatter() if formatter == "openai" else DashScopeChatFormatter(),
        toolkit=toolkit,
        max_iters=4,
    )
    agent.set_console_output_enabled(False)
    return agent


@pytest.mark.parametrize("formatter", ["openai", "dashscope"])
def test_react_agent_runs_a_tool_loop_through_the_tuner(formatter: str) -> None:
    from agentscope.message import Msg

    session, _, tracker, chat = make_session(
        [tool_call("add", {"a": 2, "b": 3}), "The answer is 5."]
    )
    tool_runs: list[dict] = []
    agent = _react_agent(ModelTuner(session), tool_runs, formatter)
    reply = asyncio.run(agent(Msg("user", "What is 2+3?", "user")))

    assert reply.get_text_content() == "The answer is 5."
    assert tool_runs == [{"a": 2, "b": 3}]
    first, second = tracker.calls
    assert first.finish_reason == "tool_calls" and second.finish_reason == "stop"
    assert [t["function"]["name"] for t in first.tools] == ["add"]
    # the second call carries the first reply and the tool result
    assert second.messages[-2]["tool_calls"][0]["function"]["name"] == "add"
    assert second.messages[-1]["role"] == "tool" and second.messages[-1]["content"] == "5"
    for call in tracker.calls:
        assert chat.decode(call.completion_ids[:-1]) == chat._content(call.response_message)


def test_react_agent_structured_output_finishes() -> None:
    from agentscope.message import Msg

    # AgentScope asks for the generate_response tool with tool_choice="required"
    script = [forced(tool_call("generate_response", {"value": 5}), '<tool_call>\n{"name": "'), "Done: 5."]
    session, _, tracker, _ = make_session(script)
    agent = _react_agent(ModelTuner(session), [])
    reply = asyncio.run(agent(Msg("user", "What is 2+3?", "user"), structured_model=Answer))
    assert reply.metadata == {"value": 5}
    assert reply.get_text_content() == "Done: 5."
    assert len(tracker.calls) == 2
