"""The gateway does what the client asked, or says why not (issue 71), over HTTP against the debug
backbone's own engine (a tiny random model with the bundled tokenizer; short generations):
tools with response_format, refusals made visible, parallel_tool_calls=false, strict tools,
max_completion_tokens over max_tokens, and episodes that made no LLM call."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import torch
from tiny_models import load_peaky

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.engine.base import SamplingParams
from ajet.engine.grammar import GrammarRuntime, tool_call_grammar
from ajet.engine.sampling import policy_temperature
from ajet.tuner import EpisodeSession, Gateway, ModelTuner
from ajet.tuner.constraints import decoding

CALC = {"type": "function", "function": {"name": "calculate", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string", "maxLength": 8}}, "required": ["expression"]}}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "integer"}}, "required": ["key"]}}}
STRICT_CALC = {"type": "function", "function": {**CALC["function"], "strict": True}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "strict": True, "schema": {
    "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}
USER = [{"role": "user", "content": "What is 23*47?"}]


@pytest.fixture(scope="module")
def peaky(tiny_model_dir):
    return load_peaky(tiny_model_dir, 4321)


@pytest.fixture(scope="module")
def engine(peaky):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    eng = LocalEngine(model, tokenizer, max_batch_size=4)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    gw = Gateway().start()
    yield gw
    gw.stop()


@dataclass
class Client:
    """One episode on the real engine, its key on the gateway."""

    session: EpisodeSession
    tracker: Any
    gateway: Gateway
    key: str

    def post(self, body: dict[str, Any]) -> httpx.Response:
        body = {"model": "ajet-policy", "messages": USER, **body}
        return httpx.post(f"{self.gateway.base_url}/chat/completions", content=json.dumps(body), timeout=120,
                          headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})

    def choice(self, body: dict[str, Any]) -> dict[str, Any]:
        reply = self.post(body)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]


def open_episode(engine: Any, peaky: Any, gateway: Gateway | None = None, episode_id: str = "e0",
                 **rollout: Any) -> tuple[EpisodeSession, Any]:
    from ajet.context.tracker import ContextTracker
    from ajet.engine.chat import ChatFormat

    chat = ChatFormat(peaky[1])
    tracker = ContextTracker(chat, None, ContextConfig())
    config = RolloutConfig(max_tokens=48, temperature=1.0, **rollout)
    return EpisodeSession(episode_id, engine, chat, tracker, config, ContextConfig(), None, 2048), tracker


@pytest.fixture
def client(engine, peaky, gateway, request) -> Iterator[Client]:
    session, tracker = open_episode(engine, peaky, **getattr(request, "param", {}))
    key = gateway.register(session, "default")
    yield Client(session, tracker, gateway, key)
    gateway.unregister_session(session)


def the_call(choice: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    return call["function"]["name"], json.loads(call["function"]["arguments"])


# ---------------------------------------------------------------- 1. tools with response_format

@pytest.mark.parametrize("tool_choice", ["required", "calculate", {"type": "function", "function": {"name": "calculate"}}])
def test_a_forced_tool_choice_wins_over_response_format(client: Client, tool_choice: Any) -> None:
    """Before, the reply was JSON text under the format and no tool call."""
    name, arguments = the_call(client.choice({"tools": [CALC], "tool_choice": tool_choice, "response_format": FORMAT,
                                              "seed": 1}))
    assert name == "calculate" and set(arguments) == {"expression"}
    assert client.choice({"response_format": FORMAT, "seed": 1})["message"]["content"].startswith('{"ok": ')


@pytest.mark.parametrize("client", [{"first_call_tool_choice": "required"}], indirect=True)
def test_first_call_tool_choice_forces_the_call_under_a_response_format(client: Client) -> None:
    name, _ = the_call(client.choice({"tools": [CALC], "response_format": FORMAT, "seed": 2}))
    assert name == "calculate"
    second = client.choice({"tools": [CALC], "response_format": FORMAT, "seed": 2})  # auto from now on
    assert second["message"].get("tool_calls") or json.loads(second["message"]["content"])["ok"] in (True, False)


def test_with_auto_the_reply_is_a_call_or_an_answer_in_the_format(client: Client, peaky) -> None:
    """The model chooses: this one answers in the format unless a logit_bias on "<" makes it start
    the call's markup (before, the format alone held and no call could start)."""
    (angle,) = peaky[1].encode("<", add_special_tokens=False)
    kinds = set()
    for seed, bias in ((0, None), (1, None), (0, {str(angle): 30})):
        # strict: the call's arguments follow the schema too (else any JSON object, which a random model
        # may write past max_tokens)
        message = client.choice({"tools": [STRICT_CALC], "tool_choice": "auto", "response_format": FORMAT,
                                 "seed": seed, "logit_bias": bias})["message"]
        if message.get("tool_calls"):
            (call,) = message["tool_calls"]
            assert call["function"]["name"] == "calculate"
            assert set(json.loads(call["function"]["arguments"])) == {"expression"}
            kinds.add("call")
        else:
            assert isinstance(json.loads(message["content"])["ok"], bool)
            kinds.add("answer")
    assert kinds == {"call", "answer"}  # both branches of the grammar are open to the model
    assert any(client.tracker.calls[-1].completion_forced)  # the markup, forced by the grammar


# ---------------------------------------------------------------- 2. every refusal is visible

def test_each_refused_call_is_counted_by_its_field_and_logged(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    bad = [({"audio": {"voice": "alloy"}}, "audio"), ({"temperature": 5}, "temperature"),
           ({"tools": [CALC], "tool_choice": "search"}, "tool_choice"), ({"messages": []}, "messages")]
    with caplog.at_level(logging.WARNING, logger="ajet.tuner.session"):
        for body, field in bad:
            reply = client.post(body)
            assert reply.status_code == 400 and reply.json()["error"]["param"] == field, reply.text
        logged = [r.getMessage() for r in caplog.records if r.name == "ajet.tuner.session"]
        assert len(logged) == 1 and "audio" in logged[0]  # the first one, with its reason
        client.session.close()
    stats = client.session.stats()
    assert {k: v for k, v in stats.items() if k.startswith("gateway/refused/")} == {
        f"gateway/refused/{field}": 1 for _, field in bad}
    assert stats["tuner/failed_calls"] == 4 and stats["tuner/calls"] == 0
    count = [r.getMessage() for r in caplog.records if r.name == "ajet.tuner.session"][-1]
    assert "4 calls were refused in all" in count and "temperature: 1" in count


def test_an_episode_whose_calls_were_refused_carries_them_into_the_metrics_and_the_signs(
        engine, peaky, gateway, caplog: pytest.LogCaptureFixture) -> None:
    """A client that swallows its 400s (or answers from its own cache) ends 'ok, 0 calls': the episode
    says which calls were refused, the step's metrics count them, and the not-learning detector warns."""
    from ajet.outputs.learning_signs import LearningSignsMonitor
    from ajet.rollout.manager import RolloutResult
    from ajet.rollout.runner import TaskRunner
    from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

    @dataclass
    class Handle:
        tuner: ModelTuner
        tracker: Any
        session: EpisodeSession

        def close(self) -> None:
            self.tuner.close()

    class Factory:
        def open_episode(self, episode_id: str, task: WorkflowTask) -> Handle:
            session, tracker = open_episode(engine, peaky, episode_id=episode_id)
            return Handle(ModelTuner(session, gateway=gateway), tracker, session)

    class Swallowing(Workflow):
        async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
            base_url, key = tuner.base_url_and_key()
            async with httpx.AsyncClient(timeout=60) as http:
                for field in ("audio", "audio", "reasoning_effort"):
                    reply = await http.post(f"{base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                            json={"messages": USER, field: "high"})
                    assert reply.status_code == 400
            return WorkflowOutput(reward=1.0)

    runner = TaskRunner(Swallowing(), None, Factory(), RolloutConfig())
    episode = asyncio.run(runner.run_episode(WorkflowTask(task_id="t0", main_query="q"), "s1-t0-e0", "t0"))
    assert (episode.status, episode.num_calls, episode.refused) == ("ok", 0, {"audio": 2, "reasoning_effort": 1})
    metrics = RolloutResult(episodes=[episode], ok_episodes=[episode]).metrics()
    assert metrics["rollout/zero_call_episodes"] == 1.0
    assert (metrics["gateway/refused/audio"], metrics["gateway/refused/reasoning_effort"]) == (2.0, 1.0)
    with caplog.at_level(logging.WARNING, logger="ajet.outputs.learning_signs"):
        (sign,) = LearningSignsMonitor().observe(1, metrics)
    assert sign.name == "zero_call_episodes" and "gateway/refused/audio 2" in sign.evidence
    assert "cache=False" in sign.lever and any("zero_call_episodes" in r.getMessage() for r in caplog.records)


def test_a_step_without_zero_call_episodes_shows_no_such_sign() -> None:
    from ajet.outputs.learning_signs import find_learning_signs

    rows = [{"step": s, "split": "train", "rollout/zero_call_episodes": 0.0} for s in range(1, 5)]
    assert find_learning_signs(rows) == []
    rows[2]["rollout/zero_call_episodes"] = 3.0
    (sign,) = find_learning_signs(rows)
    assert (sign.name, sign.step, sign.last_step) == ("zero_call_episodes", 3, 3)


# ---------------------------------------------------------------- 3. parallel_tool_calls: false

def test_parallel_tool_calls_false_is_one_call_then_the_end(client: Client) -> None:
    """Before, a 400: ajet could not stop the model from writing a second call."""
    name, arguments = the_call(client.choice({"tools": [CALC], "tool_choice": "required", "parallel_tool_calls": False,
                                              "seed": 4}))
    call = client.tracker.calls[-1]
    assert name == "calculate" and set(arguments) == {"expression"}
    text = client.session.chat_format.decode(call.completion_ids)
    assert text.count("<tool_call>") == 1 and call.completion_forced[-1]  # the end came forced, after one call
    assert call.completion_ids[-1] in client.session.chat_format.eos_token_ids


@pytest.mark.parametrize("client", [{"tool_call_grammar": "off"}], indirect=True)
def test_parallel_tool_calls_false_puts_a_call_under_the_grammar_even_with_it_off(client: Client) -> None:
    """With the grammar off a forced call is only its prefix, and the model may write on (more calls);
    parallel_tool_calls=false takes the grammar, which closes the call and forces the end."""
    body = {"tools": [CALC], "tool_choice": "required", "seed": 4, "max_tokens": 12}
    client.choice({**body, "parallel_tool_calls": True})
    assert client.tracker.calls[-1].completion_forced == []  # no grammar: free after the prefix
    client.choice({**body, "parallel_tool_calls": False})
    assert any(client.tracker.calls[-1].completion_forced)  # the markup, from the grammar


@pytest.mark.parametrize("several", [False, True])
def test_a_second_call_after_the_first_is_closed_only_when_parallel_calls_are_allowed(peaky, several: bool) -> None:
    """The grammar of calls the model starts itself (tool_choice auto): after `</tool_call>` the end is
    forced (false), or another call may follow on its own line (true, the default)."""
    _, tokenizer = peaky
    runtime = GrammarRuntime(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    constraint = runtime.start(tool_call_grammar([CALC], triggered=True, several=several))
    constraint.watch("Let me.<tool_call>")
    for token in tokenizer.encode('\n{"name": "calculate", "arguments": {"expression": "2"}}\n</tool_call>',
                                  add_special_tokens=False):
        constraint.accept(token)
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    logits = torch.zeros(len(tokenizer))
    logits[newline] = 50.0  # the model wants another line
    gen = torch.Generator().manual_seed(0)
    choice = constraint.choose(logits, SamplingParams(), gen)
    if several:
        assert (choice.token_id, choice.forced) == (newline, False)  # the start of a next call is allowed
    else:
        assert (choice.token_id, choice.forced) == (tokenizer.eos_token_id, True)


# ---------------------------------------------------------------- 4. strict tools

@pytest.mark.parametrize("client", [{"tool_call_grammar": "off"}], indirect=True)
def test_a_strict_tools_arguments_follow_its_schema_with_exact_logprobs(client: Client, peaky) -> None:
    model, _ = peaky
    body = {"tools": [STRICT_CALC, LOOKUP], "tool_choice": "calculate", "seed": 6}
    name, arguments = the_call(client.choice(body))
    assert name == "calculate" and set(arguments) == {"expression"} and len(arguments["expression"]) <= 8
    call = client.tracker.calls[-1]
    assert any(call.completion_forced) and not all(call.completion_forced)
    with torch.inference_mode():
        logits = model(torch.tensor([call.prompt_ids + call.completion_ids])).logits[0].float()
    rows = logits[len(call.prompt_ids) - 1:-1] / policy_temperature(client.session.rollout.temperature)
    expected = torch.log_softmax(rows, dim=-1).gather(1, torch.tensor(call.completion_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(call.completion_logprobs), expected, atol=1e-4)  # the unmasked model's
    # without strict and with the grammar off, the same forced call is only its prefix: nothing holds the arguments
    client.choice({**body, "tools": [CALC, LOOKUP]})
    assert client.tracker.calls[-1].completion_forced == []


@pytest.mark.parametrize("mode", ["off", "forced"])
def test_a_call_the_model_starts_of_a_strict_tool_follows_its_schema(engine, peaky, mode: str) -> None:
    _, tokenizer = peaky
    rollout = RolloutConfig(tool_call_grammar=mode)
    assert decoding(engine, rollout, [CALC], "auto", None).grammar is None  # not strict: free
    grammar = decoding(engine, rollout, [STRICT_CALC, LOOKUP], "auto", None).grammar
    assert grammar is not None and grammar.trigger == "<tool_call>"
    calc, lookup = (line for line in grammar.lark.splitlines() if line.startswith("call_"))
    assert '"maxLength": 8' in calc and '"key"' not in lookup  # only the strict tool's schema holds
    runtime = GrammarRuntime(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    constraint = runtime.start(decoding(engine, rollout, [STRICT_CALC], "auto", None).grammar)
    constraint.watch("I will compute.<tool_call>")
    gen = torch.Generator().manual_seed(0)
    tokens = []
    for _ in range(60):
        choice = constraint.choose(torch.randn(len(tokenizer), generator=gen), SamplingParams(), gen)
        if choice.token_id == tokenizer.eos_token_id:
            break
        tokens.append(choice.token_id)
        constraint.accept(choice.token_id)
    text = tokenizer.decode(tokens)
    call = json.loads(text[text.index("{"):text.index("\n</tool_call>")])
    assert call["name"] == "calculate" and set(call["arguments"]) == {"expression"}
    assert len(call["arguments"]["expression"]) <= 8


# ---------------------------------------------------------------- 5. max_completion_tokens wins

def test_max_completion_tokens_wins_over_max_tokens(client: Client) -> None:
    for max_tokens, max_completion_tokens in ((6, 2), (2, 4)):
        reply = client.post({"max_tokens": max_tokens, "max_completion_tokens": max_completion_tokens, "seed": 3})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == max_completion_tokens
        assert reply.json()["choices"][0]["finish_reason"] == "length"


def test_a_reply_cut_in_its_second_call_keeps_the_first() -> None:
    """Parallel calls under a grammar: the complete call stays, the cut one comes as OpenAI cuts it."""
    from ajet.engine import chat
    from ajet.tuner.replies import reply

    class Parser:
        parse_completion = staticmethod(chat.parse_completion)
        to_openai_message = staticmethod(chat.to_openai_message)

    text = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calculate", "arguments": {"expression": "3*')
    out = reply(Parser(), text, "length", parse=True, forced=True)
    first, second = out.message["tool_calls"]
    assert out.finish_reason == "length" and out.message["content"] is None
    assert json.loads(first["function"]["arguments"]) == {"expression": "2"}
    assert second["function"] == {"name": "calculate", "arguments": '{"expression": "3*'}
