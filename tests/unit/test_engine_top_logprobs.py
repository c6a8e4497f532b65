"""top_logprobs (issue 58 §2): per completion token, the most likely tokens of the distribution
its logprob is recorded in, from the debug backbone's engine and through the gateway over HTTP."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from tiny_models import load_peaky

from ajet.engine.base import SamplingParams
from ajet.engine.sampling import logprob_temperature, penalised, validate_params

CALC = {"type": "function", "function": {"name": "calculate", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string", "maxLength": 8}}, "required": ["expression"]}}}


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


def reference_rows(model, prompt: list[int], completion: list[int], params: SamplingParams) -> list[torch.Tensor]:
    """Each completion token's logprobs over the vocabulary, as the engine records them."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    t = logprob_temperature(params)
    return [torch.log_softmax(penalised(logits[len(prompt) - 1 + i], params, completion[:i]) / t, dim=-1)
            for i in range(len(completion))]


def assert_alternatives_match(completion, rows: list[torch.Tensor], k: int) -> None:
    assert len(completion.top_logprobs) == len(completion.token_ids) == len(rows)
    for token, logprob, top, row in zip(completion.token_ids, completion.logprobs, completion.top_logprobs, rows,
                                        strict=True):
        ids, values = [i for i, _ in top], [v for _, v in top]
        assert len(top) == k and values == sorted(values, reverse=True)
        expected_values, _ = torch.topk(row, k)
        assert max(abs(a - b) for a, b in zip(values, expected_values.tolist(), strict=True)) < 1e-4
        assert all(abs(float(row[i]) - v) < 1e-4 for i, v in top)
        if token in ids:  # the sampled token's own entry is its recorded logprob
            assert abs(values[ids.index(token)] - logprob) < 1e-5
        else:
            assert logprob <= values[-1] + 1e-5


def test_top_logprobs_are_the_recorded_distributions_most_likely_tokens(engine, peaky) -> None:
    model, tokenizer = peaky
    prompt = tokenizer.encode("Question: what comes next")
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=5, top_logprobs=5)
    # two at once: the first token comes from the prefill's logits, the rest from batched decode steps
    async def both():
        return await asyncio.gather(engine.generate(prompt, params), engine.generate(prompt[:-1], params))

    first, second = asyncio.run(both())
    assert_alternatives_match(first[0], reference_rows(model, prompt, first[0].token_ids, params), 5)
    assert_alternatives_match(second[0], reference_rows(model, prompt[:-1], second[0].token_ids, params), 5)
    alone = asyncio.run(engine.generate(prompt, params))[0]
    plain = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=8, seed=5)))[0]
    assert plain.top_logprobs == [] and plain.token_ids == alone.token_ids  # asking changes no token


def test_top_logprobs_under_a_logit_bias_are_the_adjusted_distributions(engine, peaky) -> None:
    model, tokenizer = peaky
    prompt = tokenizer.encode("Question: tell me more")
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=2, logit_bias={77: 100.0}, top_logprobs=3)
    (completion,) = asyncio.run(engine.generate(prompt, params))
    assert completion.token_ids == [77] * 4
    assert all(top[0][0] == 77 and top[0][1] > -1e-3 for top in completion.top_logprobs)
    assert_alternatives_match(completion, reference_rows(model, prompt, completion.token_ids, params), 3)


def test_out_of_range_top_logprobs_are_refused() -> None:
    for bad in (-1, 21):
        with pytest.raises(ValueError, match="top_logprobs"):
            validate_params(SamplingParams(top_logprobs=bad))


def _session(engine, tokenizer):
    from ajet.config.schema import ContextConfig, RolloutConfig
    from ajet.context.tracker import ContextTracker
    from ajet.engine.chat import ChatFormat
    from ajet.tuner import EpisodeSession

    chat = ChatFormat(tokenizer)
    tracker = ContextTracker(chat, None, ContextConfig())
    config = RolloutConfig(max_tokens=24, temperature=1.0)
    return EpisodeSession("e0", engine, chat, tracker, config, ContextConfig(), None, 2048), tracker


def test_the_gateway_returns_them_with_penalties_and_under_a_grammar(engine, peaky) -> None:
    """Over HTTP against the debug backbone's own engine (not a fake that says it can)."""
    from ajet.tuner import Gateway

    _, tokenizer = peaky
    session, tracker = _session(engine, tokenizer)
    gateway = Gateway().start()
    try:
        key = gateway.register(session, "default")

        def post(body: dict) -> dict:
            body = {"model": "ajet-policy", "messages": [{"role": "user", "content": "2+2?"}], **body}
            reply = httpx.post(f"{gateway.base_url}/chat/completions", content=json.dumps(body), timeout=60,
                               headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]

        choice = post({"logprobs": True, "top_logprobs": 4, "frequency_penalty": 0.5, "seed": 1})
        content, call = choice["logprobs"]["content"], tracker.calls[-1]
        assert [c["logprob"] for c in content] == call.completion_logprobs  # the recorded ones, penalised
        for c in content:
            assert len(c["top_logprobs"]) == 4 and set(c["top_logprobs"][0]) == {"token", "logprob", "bytes"}
            assert c["top_logprobs"][0]["logprob"] >= c["logprob"] - 1e-6
        # a call forced under the tool's grammar: one entry per completion token, forced ones included
        choice = post({"logprobs": True, "top_logprobs": 2, "tools": [CALC], "tool_choice": "required"})
        call = tracker.calls[-1]
        assert any(call.completion_forced)
        assert len(choice["logprobs"]["content"]) == len(call.completion_ids)
        assert all(len(c["top_logprobs"]) == 2 for c in choice["logprobs"]["content"])
    finally:
        gateway.stop()
