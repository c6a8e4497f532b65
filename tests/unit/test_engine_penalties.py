"""frequency_penalty, presence_penalty and logit_bias (issue 58 §2): applied in sampling, and the
recorded logprob is that of the adjusted distribution the token was sampled from. The trainer
recomputes the policy's own (unadjusted) logprob, so the update's ratio is an importance weight
from the sampling distribution to the policy."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tiny_models import load_peaky

from ajet.engine.base import SamplingParams
from ajet.engine.sampling import penalised, validate_params


@pytest.fixture(scope="module")
def peaky(tiny_model_dir):
    return load_peaky(tiny_model_dir, 1234)


@pytest.fixture
def engine(peaky):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    eng = LocalEngine(model, tokenizer, max_batch_size=4)
    yield eng
    eng.close()


def test_penalised_by_hand() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, logit_bias={0: 10.0, 3: -1.0})
    # token 2 twice, token 1 once: 2 - 2 x 0.5 - 0.25 = 0.75 ... 1 - 0.5 - 0.25 = 1.25
    assert penalised(logits, params, [2, 1, 2]).tolist() == [11.0, 1.25, 1.75, 3.0]
    assert penalised(logits, SamplingParams(), [2, 2]) is logits  # nothing to apply: the row itself
    assert logits.tolist() == [1.0, 2.0, 3.0, 4.0]  # never in place


@pytest.mark.parametrize("params", [SamplingParams(frequency_penalty=2.5), SamplingParams(presence_penalty=-3),
                                    SamplingParams(logit_bias={5: 101.0}), SamplingParams(logit_bias={-1: 1.0})])
def test_out_of_range_values_are_refused(params: SamplingParams) -> None:
    with pytest.raises(ValueError):
        validate_params(params)


def reference(model, prompt: list[int], completion: list[int], params: SamplingParams) -> tuple[list[float], list[float]]:
    """(the adjusted distribution's logprobs, the policy's own) of each completion token."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    adjusted, policy = [], []
    for i, token in enumerate(completion):
        row = logits[len(prompt) - 1 + i]
        adjusted.append(float(torch.log_softmax(penalised(row, params, completion[:i]), dim=-1)[token]))
        policy.append(float(torch.log_softmax(row, dim=-1)[token]))
    return adjusted, policy


def test_logit_bias_steers_sampling_and_its_distribution_is_recorded(engine, peaky) -> None:
    model, tokenizer = peaky
    prompt = tokenizer.encode("Question: tell me more tell me more")
    free = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0, max_tokens=6)))[0]
    target = next(t for t in range(5, 200) if t not in free.token_ids and t != tokenizer.eos_token_id)
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=1, logit_bias={target: 100.0})
    (completion,) = asyncio.run(engine.generate(prompt, params))
    assert completion.token_ids == [target] * 6  # +100 on one logit: nothing else is drawn
    adjusted, policy = reference(model, prompt, completion.token_ids, params)
    assert max(abs(a - b) for a, b in zip(completion.logprobs, adjusted, strict=True)) < 1e-4
    assert all(lp > -1e-3 for lp in completion.logprobs)  # ~log 1 under the biased distribution
    assert all(p < -1.0 for p in policy)  # the policy itself puts little mass there: the ratio is small


def test_frequency_and_presence_penalties_with_their_logprobs(engine, peaky) -> None:
    model, tokenizer = peaky
    prompt = tokenizer.encode("Question: tell me more")
    greedy = SamplingParams(temperature=0, max_tokens=12)
    plain = asyncio.run(engine.generate(prompt, greedy))[0].token_ids
    assert len(set(plain)) == len(plain)  # this model does not repeat itself greedily...
    # ...negative penalties make a token it wrote likelier again
    params = SamplingParams(temperature=0, max_tokens=12, frequency_penalty=-2.0, presence_penalty=-2.0,
                            logprob_temperature=1.0)
    (completion,) = asyncio.run(engine.generate(prompt, params))
    assert completion.token_ids != plain and len(set(completion.token_ids)) < len(completion.token_ids)
    adjusted, _ = reference(model, prompt, completion.token_ids, params)
    assert max(abs(a - b) for a, b in zip(completion.logprobs, adjusted, strict=True)) < 1e-4
    # greedy under the penalties: each token is the argmax of the adjusted row
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion.token_ids])).logits[0].float()
    for i, token in enumerate(completion.token_ids):
        assert int(penalised(logits[len(prompt) - 1 + i], params, completion.token_ids[:i]).argmax()) == token
