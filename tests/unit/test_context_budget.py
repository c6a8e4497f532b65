"""Budgets: per-call max_tokens, per-sample and window limits with drop / truncate / split."""

from __future__ import annotations

import pytest

from ajet.config.schema import ContextConfig, LossAgg, OverflowPolicy
from ajet.context.budget import apply_budget, call_budget
from ajet.context.loss_weights import loss_weights
from ajet.context.pack import pack_samples
from ajet.context.types import Sample


def cfg(**kw) -> ContextConfig:
    return ContextConfig(**kw)


def test_call_budget():
    c = cfg(max_call_tokens=100, max_model_len=0)
    assert call_budget(10, 50, c, 1000) == 50  # the request fits
    assert call_budget(10, 500, c, 1000) == 100  # capped by max_call_tokens
    assert call_budget(950, 500, c, 1000) == 50  # capped by the room left in the window
    assert call_budget(1000, 500, c, 1000) == 0  # the prompt alone fills the window
    assert call_budget(1200, 500, c, 1000) == 0
    assert call_budget(10, 0, c, 1000) == 100  # no request: the per-call limit
    assert call_budget(10, 500, c, 0) == 100  # unknown window
    assert call_budget(10, 500, cfg(max_call_tokens=0), 1000) == 500  # no per-call limit
    with pytest.raises(ValueError, match="no limit"):
        call_budget(10, 0, cfg(max_call_tokens=0), 0)
    assert (
        call_budget(10, 500, cfg(max_call_tokens=100, max_model_len=64), 1000) == 54
    )  # config wins


def sample(n: int, episode: str = "e") -> Sample:
    """n tokens; calls of 4 trained tokens after every 4 context tokens."""
    mask = [1 if (i // 4) % 2 else 0 for i in range(n)]
    calls = [i // 8 if m else -1 for i, m in enumerate(mask)]
    return Sample(
        input_ids=list(range(1000, 1000 + n)),
        loss_mask=mask,
        old_logprobs=[-i / 1000 if m else 0.0 for i, m in enumerate(mask)],
        advantage=[0.5] * n,
        episode_id=episode,
        segments=[(i, i + 4) for i in range(4, n, 8)],
        num_calls=len({c for c in calls if c >= 0}),
        token_call_ids=calls,
    )


def test_under_the_limit_is_untouched():
    samples = [sample(16)]
    out, counts = apply_budget(samples, cfg(max_sample_tokens=16), 0)
    assert out[0] is samples[0] and not any(counts.values())


def test_drop():
    out, counts = apply_budget(
        [sample(16), sample(40)], cfg(max_sample_tokens=32, overflow_policy=OverflowPolicy.drop), 0
    )
    assert [len(s.input_ids) for s in out] == [16]
    assert counts["overflow/sample"] == 1 and counts["overflow/dropped_samples"] == 1
    assert counts["overflow/window"] == 0


def test_truncate_cuts_and_counts():
    s = sample(40)
    out, counts = apply_budget(
        [s], cfg(max_sample_tokens=100, overflow_policy=OverflowPolicy.truncate), 30
    )
    (t,) = out
    assert t.input_ids == s.input_ids[:30] and t.loss_mask == s.loss_mask[:30]
    assert t.advantage == s.advantage[:30] and t.token_call_ids == s.token_call_ids[:30]
    assert t.segments == [(4, 8), (12, 16), (20, 24), (28, 30)]
    assert t.num_calls == 4
    assert counts["overflow/window"] == 1 and counts["overflow/sample"] == 0
    assert counts["overflow/truncated_tokens"] == 10
    assert counts["overflow/truncated_trained_tokens"] == sum(s.loss_mask[30:]) == 6


def test_split_trains_every_token_once_with_leading_context():
    s = sample(100)
    limit = 32
    out, counts = apply_budget(
        [s], cfg(max_sample_tokens=limit, overflow_policy=OverflowPolicy.split), 0
    )
    assert counts["overflow/split_pieces"] == len(out) > 1
    assert all(len(p.input_ids) <= limit for p in out)
    trained = []
    for p in out:
        start, end = p.metadata["budget_slice"]
        assert p.input_ids == s.input_ids[start:end]
        assert p.loss_mask[0] == 0  # nothing predicts a piece's first token
        trained += [start + i for i, m in enumerate(p.loss_mask) if m]
    assert trained == [i for i, m in enumerate(s.loss_mask) if m]
    # Pieces are valid samples: they pack and get the same token_mean weight per token.
    weights = loss_weights(out, LossAgg.token_mean)
    packed = pack_samples(out, weights, 4096)
    assert sum(p.num_entries for p in packed) == sum(s.loss_mask)
    # seq_mean still counts each call once across pieces.
    seq = loss_weights(out, LossAgg.seq_mean)
    per_call: dict[int, float] = {}
    for p, ws in zip(out, seq, strict=False):
        for c, w in zip(p.token_call_ids, ws, strict=False):
            if c >= 0:
                per_call[c] = per_call.get(c, 0.0) + w
    assert all(v == pytest.approx(1 / len(per_call)) for v in per_call.values())
