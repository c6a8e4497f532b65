"""Sampling helpers: parameter checks, token choice, logprob temperature, stop strings."""

from __future__ import annotations

import math

import pytest
import torch

from ajet.engine.base import SamplingParams
from ajet.engine.sampling import (
    choose_token,
    find_stop,
    logprob_temperature,
    make_generator,
    stop_strings,
    validate_params,
)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(n=0), "n"),
        (SamplingParams(logprob_temperature=0.0), "logprob_temperature"),
        (SamplingParams(stop=[""]), "stop"),
    ],
)
def test_validate_params_names_the_bad_field(params, field):
    with pytest.raises(ValueError, match=field):
        validate_params(params)


def test_validate_accepts_defaults_and_a_bare_stop_string():
    validate_params(SamplingParams())
    params = SamplingParams(stop="END")  # type: ignore[arg-type]
    validate_params(params)
    assert stop_strings(params) == ["END"]


def test_greedy_picks_argmax_with_untempered_logprob():
    logits = torch.tensor([0.1, 2.0, -1.0, 1.9])
    choice = choose_token(logits, SamplingParams(temperature=0), make_generator(0, 0))
    assert choice.token_id == 1
    assert choice.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[1]), abs=1e-6)


@pytest.mark.parametrize(
    ("temperature", "lp_t", "expected_t"), [(0.5, None, 0.5), (0.5, 1.0, 1.0), (2.0, 0.7, 0.7)]
)
def test_logprob_is_at_the_logprob_temperature(temperature, lp_t, expected_t):
    params = SamplingParams(temperature=temperature, logprob_temperature=lp_t)
    assert logprob_temperature(params) == expected_t
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    choice = choose_token(logits, params, make_generator(1, 0))
    expected = float(torch.log_softmax(logits / expected_t, -1)[choice.token_id])
    assert choice.logprob == pytest.approx(expected, abs=1e-6)


def test_top_k_only_samples_the_k_best():
    logits = torch.randn(200, generator=torch.Generator().manual_seed(1))
    best = set(torch.topk(logits, 5).indices.tolist())
    gen = make_generator(3, 0)
    seen = {
        choose_token(logits, SamplingParams(temperature=2.0, top_k=5), gen).token_id
        for _ in range(300)
    }
    assert seen <= best and len(seen) >= 3


@pytest.mark.parametrize(
    ("top_p", "allowed"), [(0.7, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2}), (0.4, {0})]
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, allowed):
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = make_generator(4, 0)
    seen = {
        choose_token(logits, SamplingParams(temperature=1.0, top_p=top_p), gen).token_id
        for _ in range(400)
    }
    assert seen == allowed


def test_generators_reproducible_and_independent():
    draw = lambda g: torch.rand(4, generator=g).tolist()  # noqa: E731
    assert draw(make_generator(5, 0)) == draw(make_generator(5, 0))
    assert draw(make_generator(5, 0)) != draw(make_generator(5, 1))
    assert draw(make_generator(5, 1)) != draw(make_generator(6, 0))
    assert draw(make_generator(None, 0)) != draw(make_generator(None, 0))


def test_non_finite_logits_raise():
    logits = torch.tensor([0.0, math.nan, 1.0])
    with pytest.raises(FloatingPointError):
        choose_token(logits, SamplingParams(temperature=1.0), make_generator(0, 0))


def test_find_stop_returns_the_earliest_match():
    assert find_stop("abc STOP def END", ["END", "STOP"]) == 4
    assert find_stop("nothing here", ["END"]) == -1
    assert find_stop("", ["x"]) == -1


def test_inverse_cdf_draws_follow_the_weights():
    from ajet.engine.sampling import sample_index

    weights = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3])
    gen = make_generator(11, 0)
    counts = torch.bincount(
        torch.tensor([sample_index(weights, gen) for _ in range(4000)]), minlength=5
    )
    assert counts[0] == 0 and counts[2] == 0  # zero-probability tokens are never drawn
    freq = counts.double() / 4000
    assert torch.allclose(freq, weights.double(), atol=0.03)


@pytest.mark.parametrize(("top_p", "allowed"), [(0.9, {0, 1, 2}), (0.8, {0, 1})])
def test_top_k_then_top_p_on_the_renormalised_distribution(top_p, allowed):
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = make_generator(5, 0)
    params = SamplingParams(temperature=1.0, top_k=3, top_p=top_p)
    seen = {choose_token(logits, params, gen).token_id for _ in range(400)}
    assert seen == allowed


def test_wide_nucleus_beyond_the_candidate_shortlist():
    # A flat-ish distribution whose 0.5-nucleus spans ~2400 tokens (more than the
    # 1024-token shortlist): the full-sort fallback must still sample the whole nucleus.
    weights = torch.linspace(2.0, 1.0, 5000)
    perm = torch.randperm(5000, generator=torch.Generator().manual_seed(0))
    logits = torch.log(weights[perm] / weights.sum())
    order = torch.argsort(logits, descending=True)
    probs = torch.softmax(logits, -1)[order]
    nucleus_size = int(((torch.cumsum(probs, 0) - probs) < 0.5).sum())
    nucleus = set(order[:nucleus_size].tolist())
    gen = make_generator(6, 0)
    params = SamplingParams(temperature=1.0, top_p=0.5)
    seen = [choose_token(logits, params, gen).token_id for _ in range(300)]
    assert set(seen) <= nucleus
    ranks = {tok: r for r, tok in enumerate(order.tolist())}
    assert max(ranks[t] for t in seen) > 1024


def test_choose_tokens_equals_choose_token_row_by_row_and_isolates_a_bad_row():
    from ajet.engine.sampling import choose_token, choose_tokens, make_generator

    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(0)) * 3
    logits[4, 7] = float("nan")
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.7, logprob_temperature=1.0), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, logprob_temperature=1.0)]
    got = choose_tokens(logits, params, [make_generator(3, i) for i in range(6)])
    assert isinstance(got[4], FloatingPointError)
    for i, p in enumerate(params):
        if i == 4:
            continue
        expected = choose_token(logits[i], p, make_generator(3, i))
        assert got[i].token_id == expected.token_id
        assert abs(got[i].logprob - expected.logprob) < 1e-5
