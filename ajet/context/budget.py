"""Token budgets: per call, per sample and the model window, never silently truncated.

- `call_budget` caps one call's `max_tokens` (`context.max_call_tokens` and the room
  left in the model window); the tuner applies it before generating.
- `apply_budget` enforces the sample limit `min(max_sample_tokens, window)` on merged
  samples with `context.overflow_policy`, and counts every overflow:
  - drop: the sample is removed.
  - truncate: tokens past the limit are cut and gone (their loss too).
  - split: the sample becomes pieces of at most `limit` tokens. Each piece after the
    first starts with the last `limit // 4` tokens of the piece before it as untrained
    context, then continues; every trained token is trained in exactly one piece.
    Tokens beyond a piece's start see only that piece (the earlier context is gone),
    so split is lossy: prefer it only over dropping long episodes.

Counts (keys of the returned dict): `overflow/sample` (samples over max_sample_tokens),
`overflow/window` (over the model window), `overflow/dropped_samples`,
`overflow/truncated_tokens`, `overflow/truncated_trained_tokens`, `overflow/split_pieces`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from ajet.config.schema import ContextConfig, OverflowPolicy
from ajet.context.types import Sample

__all__ = ["apply_budget", "call_budget", "model_window"]

T = TypeVar("T")


def model_window(config: ContextConfig, model_max_len: int) -> int:
    """The model's context window: `config.max_model_len` if set, else the model's (0 = unknown)."""
    return config.max_model_len if config.max_model_len > 0 else max(0, model_max_len)


def call_budget(
    prompt_len: int, requested_max_tokens: int, config: ContextConfig, model_max_len: int
) -> int:
    """The max_tokens one call may generate; 0 when the prompt alone fills the window.

    The smallest of the request, `config.max_call_tokens` and the room left in the model
    window; a value <= 0 for the request or `max_call_tokens` means no limit from it.
    """
    limits = [v for v in (requested_max_tokens, config.max_call_tokens) if v > 0]
    window = model_window(config, model_max_len)
    if window:
        limits.append(window - prompt_len)
    if not limits:
        raise ValueError(
            "no limit on a call's completion: set rollout.max_tokens, context.max_call_tokens "
            "or context.max_model_len"
        )
    return max(0, min(limits))


def apply_budget(
    samples: list[Sample], config: ContextConfig, model_max_len: int
) -> tuple[list[Sample], dict[str, int]]:
    """Enforce the per-sample and model-window limits; see the module docstring."""
    window = model_window(config, model_max_len)
    limit = config.max_sample_tokens if config.max_sample_tokens > 0 else 0
    if window:
        limit = min(limit, window) if limit else window
    counts = {
        "overflow/sample": 0,
        "overflow/window": 0,
        "overflow/dropped_samples": 0,
        "overflow/truncated_tokens": 0,
        "overflow/truncated_trained_tokens": 0,
        "overflow/split_pieces": 0,
    }
    if not limit:
        return list(samples), counts
    policy = OverflowPolicy(config.overflow_policy)
    out: list[Sample] = []
    for s in samples:
        n = len(s.input_ids)
        if n <= limit:
            out.append(s)
            continue
        counts["overflow/sample"] += int(0 < config.max_sample_tokens < n)
        counts["overflow/window"] += int(0 < window < n)
        if policy is OverflowPolicy.drop:
            counts["overflow/dropped_samples"] += 1
        elif policy is OverflowPolicy.truncate:
            counts["overflow/truncated_tokens"] += n - limit
            counts["overflow/truncated_trained_tokens"] += sum(s.loss_mask[limit:])
            out.append(_slice(s, 0, limit, train_from=0))
        else:
            pieces = _split(s, limit)
            counts["overflow/split_pieces"] += len(pieces)
            out.extend(pieces)
    return out, counts


def _split(s: Sample, limit: int) -> list[Sample]:
    keep = max(1, limit // 4)  # leading context carried into the next piece
    pieces, start, train_from = [], 0, 0
    while True:
        end = min(start + limit, len(s.input_ids))
        piece = _slice(s, start, end, train_from=train_from)
        if any(piece.loss_mask):
            pieces.append(piece)
        if end == len(s.input_ids):
            return pieces
        start, train_from = end - keep, end


def _slice(s: Sample, start: int, end: int, *, train_from: int) -> Sample:
    """Tokens [start, end) of `s`; tokens before `train_from` (absolute) become context."""

    def cut(values: list[T], untrained: T) -> list[T]:
        if not values:
            return []
        return [
            v if start + i >= train_from else untrained for i, v in enumerate(values[start:end])
        ]

    loss_mask = cut(s.loss_mask, 0)
    call_ids = cut(s.token_call_ids, -1)
    segments = [
        (max(a, start) - start, min(b, end) - start) for a, b in s.segments if a < end and b > start
    ]
    calls = {c for c in call_ids if c >= 0} if call_ids else set()
    return replace(
        s,
        input_ids=s.input_ids[start:end],
        loss_mask=loss_mask,
        old_logprobs=cut(s.old_logprobs, 0.0),
        advantage=cut(s.advantage, 0.0),
        token_call_ids=call_ids,
        segments=segments,
        num_calls=len(calls) if call_ids else s.num_calls,
        # The first piece keeps the sample's own break; the later ones start at the split.
        metadata={**s.metadata, "budget_slice": [start, end],
                  **({"break": "split"} if start > 0 else {})},
    )
