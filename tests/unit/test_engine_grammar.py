"""Grammar-constrained decoding (ajet/engine/grammar.py) on a tiny random Llama: a random model
writes garbage freely, so every parse below is the grammar's doing."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from tiny_models import load_peaky

from ajet.context.merge import per_call_samples
from ajet.context.types import LLMCall
from ajet.engine.base import SamplingParams
from ajet.engine.grammar import GrammarError, json_grammar, tool_call_grammar

CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            # A random model writes on forever: bounded values keep the test short.
            "properties": {"expression": {"type": "string", "maxLength": 12}},
            "required": ["expression"],
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "integer", "minimum": 0, "maximum": 999},
                           "exact": {"type": "boolean"}},
            "required": ["key", "exact"],
        },
    },
}


@pytest.fixture(scope="module")
def peaky(tiny_model_dir):
    """The tiny model with larger random weights, so that its samples vary."""
    return load_peaky(tiny_model_dir, 7)


@pytest.fixture
def engine(peaky):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    eng = LocalEngine(model, tokenizer, max_batch_size=8)
    yield eng
    eng.close()


def prompt(tokenizer, text="What is 23*47?"):
    return tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def generate(engine, ids, count, **params):
    async def run():
        return await asyncio.gather(
            *[engine.generate(list(ids), SamplingParams(seed=i, **params)) for i in range(count)]
        )

    return [c for (c,) in asyncio.run(run())]


def parse_call(text: str) -> dict:
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
    return json.loads(text[len("<tool_call>\n"):-len("\n</tool_call>")])


def test_builders_name_the_tool_and_refuse_an_unknown_one() -> None:
    assert "calculate" in tool_call_grammar([CALC], "calculate").lark
    both = tool_call_grammar([CALC, LOOKUP]).lark
    assert "calculate" in both and "lookup" in both
    with pytest.raises(GrammarError, match="'search' is not among the offered tools"):
        tool_call_grammar([CALC], "search")
    assert '"additionalProperties": false' in tool_call_grammar([CALC], "calculate").lark
    assert "additionalProperties" not in json_grammar({"type": "object", "properties": {}}).lark


def test_every_constrained_call_parses_and_fits_the_schema(engine, peaky) -> None:
    _, tokenizer = peaky
    grammar = tool_call_grammar([CALC, LOOKUP])
    completions = generate(engine, prompt(tokenizer), 6, temperature=1.0, max_tokens=96, grammar=grammar)
    for c in completions:
        assert c.finish_reason == "stop", c.text
        assert c.token_ids[-1] in engine.eos_token_ids and c.forced[-1]  # EOS is forced
        call = parse_call(c.text)
        if call["name"] == "calculate":
            assert set(call["arguments"]) == {"expression"}
            assert isinstance(call["arguments"]["expression"], str)
            assert len(call["arguments"]["expression"]) <= 12
        else:
            assert call["name"] == "lookup" and set(call["arguments"]) == {"key", "exact"}
            assert isinstance(call["arguments"]["key"], int) and 0 <= call["arguments"]["key"] <= 999
            assert isinstance(call["arguments"]["exact"], bool)
    free = generate(engine, prompt(tokenizer), 6, temperature=1.0, max_tokens=96)
    assert not any(c.text.startswith("<tool_call>") for c in free)  # the grammar did it
    assert all(c.forced == [] for c in free)


def test_forced_tokens_are_the_markup_and_sampled_logprobs_are_the_unmasked_models(engine, peaky) -> None:
    model, tokenizer = peaky
    ids = prompt(tokenizer)
    (c,) = generate(engine, ids, 1, temperature=1.0, max_tokens=96, grammar=tool_call_grammar([CALC], "calculate"))
    assert len(c.forced) == len(c.token_ids)
    head = tokenizer.decode([t for t, f in zip(c.token_ids, c.forced, strict=True)][: c.forced.index(False)])
    assert head == '<tool_call>\n{"name": "calculate", "arguments": {"expression":'
    assert not all(c.forced) and c.forced[-1]
    with torch.inference_mode():
        logits = model(torch.tensor([ids + c.token_ids])).logits[0, len(ids) - 1:-1].float()
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_forced_runs_jump_in_one_forward_with_the_same_tokens_and_logprobs(peaky) -> None:
    """Jump-forward (a grammar's forced run forwarded in one go) against one decode step per
    token: the same tokens, forced flags and logprobs, in a batch that mixes constrained
    requests (n=2, a JSON format, a triggered call) with free text, in far fewer steps."""
    from test_engine_prefix_cache import together

    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    schema = {"type": "object", "properties": {"choice": {"enum": ["Alice", "Bob", "Carol"]}},
              "required": ["choice"], "additionalProperties": False}
    requests = [
        (prompt(tokenizer), {"grammar": tool_call_grammar([CALC], "calculate"), "n": 2}),
        (prompt(tokenizer, "Who is the werewolf?"), {"grammar": json_grammar(schema)}),
        (prompt(tokenizer, "Add 2 and 3."), {"grammar": tool_call_grammar([CALC, LOOKUP], triggered=True),
                                               "max_tokens": 16}),  # a random model seldom triggers
        (prompt(tokenizer, "Say hi."), {"max_tokens": 8}),  # short: the steps count the calls
    ]

    def run(jump: bool):
        calls = [(list(ids), SamplingParams(**{"seed": i, "temperature": 1.0, "max_tokens": 64} | extra))
                 for i, (ids, extra) in enumerate(requests)]
        with LocalEngine(model, tokenizer, max_batch_size=8, jump_forward=jump) as engine:
            results = together(engine, calls)  # all join one batch: the step counts compare
            completions = [c for cs in results for c in cs]
            # the trainer's tok/s counts these: every completion token, sampled or jumped
            assert engine.decoded_tokens() == sum(len(c.token_ids) for c in completions)
            return completions, dict(engine.stats)

    jumped, jump_stats = run(True)
    stepped, step_stats = run(False)
    for a, b in zip(jumped, stepped, strict=True):
        assert a.token_ids == b.token_ids and a.forced == b.forced and a.text == b.text
        assert a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert json.loads(jumped[2].text)["choice"] in {"Alice", "Bob", "Carol"}
    assert jump_stats["jumped_tokens"] >= 2 * 15  # the call's markup, twice, at least
    assert step_stats["jumped_tokens"] == 0
    assert jump_stats["generated_tokens"] == step_stats["generated_tokens"]
    assert jump_stats["decode_steps"] < step_stats["decode_steps"] - 15


def test_jumps_run_each_rows_own_adapter(peaky) -> None:
    """A jump forwards a row under its own LoRA adapter (or the frozen base): the forced and
    chosen tokens' logprobs equal one forward of the unmasked model with that adapter."""
    import copy

    from peft import LoraConfig, get_peft_model
    from test_multi_adapter import reference_logprobs

    from ajet.engine.base import INITIAL_MODEL
    from ajet.engine.local import LocalEngine

    base, tokenizer = peaky
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(copy.deepcopy(base), config, adapter_name="wolf")
    model.add_adapter("seer", config)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    model.eval()
    ids = prompt(tokenizer)
    grammar = tool_call_grammar([CALC], "calculate")
    names = ["wolf", "seer", INITIAL_MODEL]

    async def go(engine):
        return await asyncio.gather(*[
            engine.generate(list(ids), SamplingParams(seed=i, temperature=1.0, max_tokens=64, grammar=grammar),
                            model=name) for i, name in enumerate(names)])

    with LocalEngine(model, tokenizer, max_batch_size=8) as engine:
        completions = [c for (c,) in asyncio.run(go(engine))]
        assert engine.stats["jumped_tokens"] >= 3 * 15
    for name, c in zip(names, completions, strict=True):
        expected = reference_logprobs(model, ids, c.token_ids, None if name == INITIAL_MODEL else name)
        assert max(abs(a - b) for a, b in zip(c.logprobs, expected, strict=True)) < 1e-4, name


def test_json_response_format_and_a_bad_grammar_fail_only_their_call(engine, peaky) -> None:
    from ajet.engine.grammar import Grammar

    _, tokenizer = peaky
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "maximum": 99}}, "required": ["answer"],
              "additionalProperties": False}
    for c in generate(engine, prompt(tokenizer), 3, temperature=1.0, max_tokens=48, grammar=json_grammar(schema)):
        assert c.finish_reason == "stop"
        assert isinstance(json.loads(c.text)["answer"], int)
    with pytest.raises(GrammarError, match="does not compile"):
        generate(engine, prompt(tokenizer), 1, max_tokens=4, grammar=Grammar("start: %json {oops", "broken"))
    (ok,) = generate(engine, prompt(tokenizer), 1, temperature=0.0, max_tokens=4)
    assert len(ok.token_ids) == 4


def test_forced_tokens_are_context_in_samples_and_timelines() -> None:
    from test_tuner_fakes import FakeChat

    from ajet.config.schema import ContextConfig
    from ajet.context.tracker import ContextTracker

    call = LLMCall(role="default", prompt_ids=[1, 2], completion_ids=[10, 11, 12, 13],
                   completion_logprobs=[-0.1, -0.2, -0.3, -0.4], finish_reason="stop",
                   policy_version=0, completion_forced=[True, False, False, True])
    (sample,) = per_call_samples([call], episode_id="e", group_id="g", reward=1.0)
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0]
    assert sample.old_logprobs == [0.0, 0.0, 0.0, -0.2, -0.3, 0.0]
    assert sample.token_call_ids == [-1, -1, -1, 0, 0, -1]
    tracker = ContextTracker(FakeChat(), None, ContextConfig())
    tracker.record(call)
    (timeline,) = tracker.timelines()
    assert timeline.trainable == [False, False, False, True, True, False]
    all_forced = LLMCall(role="default", prompt_ids=[1], completion_ids=[5], completion_logprobs=[0.0],
                         finish_reason="stop", policy_version=0, completion_forced=[True])
    assert per_call_samples([all_forced], episode_id="e", group_id="g", reward=1.0) == []
    bad = LLMCall(role="default", prompt_ids=[1], completion_ids=[5, 6], completion_logprobs=[0.0, 0.0],
                  finish_reason="stop", policy_version=0, completion_forced=[True])
    with pytest.raises(ValueError, match="1 forced flags"):
        tracker.record(bad)


def _session(engine, tokenizer, **rollout):
    from ajet.config.schema import ContextConfig, RolloutConfig
    from ajet.context.tracker import ContextTracker
    from ajet.engine.chat import ChatFormat
    from ajet.tuner import EpisodeSession

    chat = ChatFormat(tokenizer)
    tracker = ContextTracker(chat, None, ContextConfig())
    config = RolloutConfig(max_tokens=96, temperature=1.0, **rollout)
    return EpisodeSession("e0", engine, chat, tracker, config, ContextConfig(), None, 2048), tracker


def test_session_decodes_forced_calls_under_the_grammar(engine, peaky) -> None:
    _, tokenizer = peaky
    messages = [{"role": "user", "content": "What is 23*47?"}]
    session, tracker = _session(engine, tokenizer, first_call_tool_choice="calculate")
    result = asyncio.run(session.chat("default", messages, [CALC], seed=3))
    assert not result.malformed_tool_call and result.finish_reason == "tool_calls"
    (tool_call,) = result.message["tool_calls"]
    assert tool_call["function"]["name"] == "calculate"
    assert set(json.loads(tool_call["function"]["arguments"])) == {"expression"}
    (call,) = tracker.calls
    assert any(call.completion_forced) and not all(call.completion_forced)
    # The markup is in the completion (forced), not in the prompt as a forced start.
    assert tokenizer.decode(call.prompt_ids).endswith("<|im_start|>assistant\n")

    session, tracker = _session(engine, tokenizer, first_call_tool_choice="calculate", tool_call_grammar="off")
    asyncio.run(session.chat("default", messages, [CALC], seed=3))
    (call,) = tracker.calls
    assert call.completion_forced == []
    assert tokenizer.decode(call.prompt_ids).endswith('{"name": "calculate", "arguments": {')


def test_session_response_format_gives_json(engine, peaky) -> None:
    from ajet.tuner.session import InvalidRequestError

    _, tokenizer = peaky
    session, _ = _session(engine, tokenizer)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}}
    result = asyncio.run(session.chat("default", [{"role": "user", "content": "ok?"}], response_format=fmt))
    assert isinstance(json.loads(result.message["content"])["ok"], bool)
    with pytest.raises(InvalidRequestError, match="response_format"):
        asyncio.run(session.chat("default", [{"role": "user", "content": "ok?"}], response_format={"type": "xml"}))


def test_a_triggered_grammar_leaves_text_free_until_the_call_starts(peaky) -> None:
    from ajet.engine.grammar import GrammarRuntime

    _, tokenizer = peaky
    runtime = GrammarRuntime(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    constraint = runtime.start(tool_call_grammar([CALC], triggered=True))
    assert constraint.active is False
    constraint.watch("Let me compute it with the tool.")
    assert constraint.active is False
    text = "Let me compute it.<tool_call>\n"  # the trigger's last token also wrote the newline
    constraint.watch(text)
    assert constraint.active is True
    gen = torch.Generator().manual_seed(0)
    tokens = []
    for _ in range(80):
        choice = constraint.choose(torch.randn(len(tokenizer), generator=gen), SamplingParams(), gen)
        tokens.append(choice.token_id)
        if choice.token_id == tokenizer.eos_token_id:
            break
        constraint.accept(choice.token_id)
    call = parse_call("<tool_call>\n" + tokenizer.decode(tokens[:-1]))
    assert call["name"] == "calculate" and set(call["arguments"]) == {"expression"}
    refused = runtime.start(tool_call_grammar([CALC], triggered=True))
    refused.watch("<tool_call>[not json")
    assert refused.active is None  # gave up: the reply stays free text for the parser to judge


@pytest.mark.parametrize(
    ("mode", "tool_choice", "expected"),
    [("forced", None, None), ("forced", "calculate", ""), ("all", None, "<tool_call>"),
     ("all", "none", None), ("off", "calculate", None)],
)
def test_tool_call_grammar_modes(engine, peaky, mode, tool_choice, expected) -> None:
    _, tokenizer = peaky
    from ajet.tuner.constraints import decoding

    session, _ = _session(engine, tokenizer, tool_call_grammar=mode)
    grammar = decoding(engine, session.rollout, [CALC], tool_choice, None).grammar
    assert (grammar.trigger if grammar else None) == expected


def test_a_failed_jump_fails_its_request_only_and_says_where(peaky, monkeypatch, caplog) -> None:
    """A row whose jump raises (here: its resume) fails with that error, logged as a failed
    jump; the batch's other requests, forced or free, finish as usual."""
    from ajet.engine.decode import DecodeBatch
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    real_resume = DecodeBatch.resume
    broken = prompt(tokenizer, "Break me.")

    def resume(self, seq, run, logits):
        if seq.request.prompt_ids == broken:
            raise RuntimeError("boom in the jump")
        return real_resume(self, seq, run, logits)

    monkeypatch.setattr(DecodeBatch, "resume", resume)
    grammar = tool_call_grammar([CALC], "calculate")
    calls = [(broken, SamplingParams(seed=0, temperature=1.0, max_tokens=64, grammar=grammar)),
             (prompt(tokenizer), SamplingParams(seed=1, temperature=1.0, max_tokens=64, grammar=grammar)),
             (prompt(tokenizer, "Say hi."), SamplingParams(seed=2, temperature=1.0, max_tokens=8))]

    async def go(engine):
        return await asyncio.gather(*(engine.generate(list(ids), params) for ids, params in calls),
                                    return_exceptions=True)

    with caplog.at_level("WARNING"), LocalEngine(model, tokenizer, max_batch_size=8) as engine:
        failed, (forced,), (free,) = asyncio.run(go(engine))
        assert engine.stats["jumped_tokens"] >= 15  # the healthy forced row still jumped
    assert isinstance(failed, RuntimeError) and "boom in the jump" in str(failed)
    assert '"calculate"' in forced.text and sum(forced.forced) >= 15
    assert free.finish_reason in {"stop", "length"}
    assert any("request failed in a jump over forced tokens: RuntimeError" in r.getMessage()
               for r in caplog.records)
