"""Sampling helpers: parameter checks, token choice, logprob temperature, stop strings."""

from __future__ import annotations

import math

import pytest

from ajet.engine.base import SamplingParams
from ajet.engine.sampling import (
    choose_token,
    find_stop,
    logprob_temperature,
    make_generator,
    stop_strings,
    validate_params,
)

torch = pytest.importorskip("torch")


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
