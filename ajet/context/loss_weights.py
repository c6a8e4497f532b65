"""Loss normalisation as per-token weights that survive merging and packing.

The loss of a batch is `sum_i sum_t weights[i][t] * loss_i[t]` over trained tokens.
The weights are defined in terms of LLM calls and episodes, not samples, so they
are the same whether the batch holds one sample per call, merged samples, split
pieces or packed sequences:

- token_mean:   every trained token of the batch weighs 1 / (trained tokens).
- seq_mean:     every LLM call weighs the same, its tokens equally:
                1 / (calls * trained tokens of the call).
- episode_mean: every episode weighs the same, its tokens equally:
                1 / (episodes * trained tokens of the episode).

A call is identified by `(episode_id, token_call_ids[t])`; samples without
`token_call_ids` (built elsewhere, e.g. SFT) count as one call each.
"""

from __future__ import annotations

from collections import Counter

from ajet.config.schema import LossAgg
from ajet.context.types import Sample

__all__ = ["loss_weights"]


def _call_keys(index: int, sample: Sample) -> list[tuple[str, object] | None]:
    """Per token: the key of the call it trains, None for untrained tokens."""
    if sample.token_call_ids:
        if len(sample.token_call_ids) != len(sample.input_ids):
            raise ValueError(
                f"sample {index} (episode {sample.episode_id!r}) has {len(sample.token_call_ids)} "
                f"token_call_ids for {len(sample.input_ids)} tokens"
            )
        return [
            (sample.episode_id, c) if m and c >= 0 else None
            for m, c in zip(sample.loss_mask, sample.token_call_ids, strict=True)
        ]
    return [(sample.episode_id, ("sample", index)) if m else None for m in sample.loss_mask]


def loss_weights(samples: list[Sample], mode: LossAgg | str) -> list[list[float]]:
    """Per-token loss weights (0.0 on untrained tokens); see the module docstring."""
    mode = LossAgg(mode)
    for i, s in enumerate(samples):
        if len(s.loss_mask) != len(s.input_ids):
            raise ValueError(f"sample {i}: loss_mask and input_ids differ in length")
    keys = [_call_keys(i, s) for i, s in enumerate(samples)]
    per_call = Counter(k for ks in keys for k in ks if k is not None)
    total = sum(per_call.values())
    if total == 0:
        return [[0.0] * len(s.input_ids) for s in samples]
    if mode is LossAgg.token_mean:
        return [[0.0 if k is None else 1.0 / total for k in ks] for ks in keys]
    if mode is LossAgg.seq_mean:
        calls = len(per_call)
        return [[0.0 if k is None else 1.0 / (calls * per_call[k]) for k in ks] for ks in keys]
    per_episode: Counter[str] = Counter()
    for (episode, _), n in per_call.items():
        per_episode[episode] += n
    episodes = len(per_episode)
    return [[0.0 if k is None else 1.0 / (episodes * per_episode[k[0]]) for k in ks] for ks in keys]
