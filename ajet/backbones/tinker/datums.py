"""A step's samples as Tinker datums, and the loss that trains them (pure).

ajet's step loss is `sum_i sum_t weights[i][t] * loss_i[t]` over trained tokens
(`ajet.context.loss_weights`), with the per-token loss of PPO's clipped surrogate
`-min(r * A, clip(r) * A)`. Tinker's built-in `ppo` loss is that surrogate summed over tokens,
and `importance_sampling` is `-r * A` summed. Both are linear in A per token and a weight is
positive, so `w * loss(r, A) = loss(r, w * A)`: sending `w * A` as the token's advantage makes the
service's summed loss exactly ajet's weighted one (the same normalisation as the debug backbone).
Untrained tokens get advantage 0 (no gradient). A datum is the causal shift of a sample: input
`ids[:-1]`, targets `ids[1:]`, the sampler's logprob and the weighted advantage of each target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ajet.config.schema import AlgorithmConfig
from ajet.context.types import Sample

# The Tinker built-in losses the backbone can send (an algorithm names its one in
# `AlgorithmSpec.backbone_names["tinker"]`).
LOSSES = ("ppo", "importance_sampling")


@dataclass(frozen=True)
class RemoteDatum:
    """One sample as a Tinker `Datum`'s fields (`model_input` and `loss_fn_inputs`)."""

    model_input: list[int]
    target_tokens: list[int]
    logprobs: list[float]  # the sampler's logprob of each target token (0 where untrained)
    advantages: list[float]  # advantage x loss weight of each target token (0 where untrained)


def remote_datums(samples: Sequence[Sample], weights: Sequence[Sequence[float]]) -> list[RemoteDatum]:
    """Each sample that trains a token as a datum; samples that train none are left out (they
    add nothing to the gradient). Raises ValueError when a sample's per-token lists differ in length."""
    out = []
    for sample, w in zip(samples, weights, strict=True):
        n = len(sample.input_ids)
        if not (len(sample.loss_mask) == len(sample.old_logprobs) == len(sample.advantage) == len(w) == n):
            raise ValueError(f"sample of episode {sample.episode_id!r}: input_ids ({n}), loss_mask, old_logprobs, "
                             "advantage and loss weights differ in length")
        if not any(sample.loss_mask[1:]):
            continue
        advantages = [a * wt if m else 0.0 for m, a, wt in zip(sample.loss_mask, sample.advantage, w, strict=True)]
        logprobs = [lp if m else 0.0 for m, lp in zip(sample.loss_mask, sample.old_logprobs, strict=True)]
        out.append(RemoteDatum(model_input=list(sample.input_ids[:-1]), target_tokens=list(sample.input_ids[1:]),
                               logprobs=logprobs[1:], advantages=advantages[1:]))
    return out


def loss_config(loss_fn: str, algorithm: AlgorithmConfig) -> dict[str, float] | None:
    """`forward_backward`'s `loss_fn_config`: ppo's clip range from `algorithm.clip_ratio_low/high`."""
    if loss_fn not in LOSSES:
        raise ValueError(f"loss {loss_fn!r} is not one the tinker backbone sends (those are {', '.join(LOSSES)})")
    if loss_fn == "ppo":
        return {"clip_low_threshold": 1.0 - algorithm.clip_ratio_low,
                "clip_high_threshold": 1.0 + algorithm.clip_ratio_high}
    return None


def logprob_mismatch(sent: Sequence[RemoteDatum], trainer: Sequence[Sequence[float]]) -> dict[str, float]:
    """The sampler's logprobs against the trainer's at the same weights (the first
    `forward_backward`'s outputs), over the trained tokens: ~0 when both compute the same model."""
    diffs = [abs(s - t) for datum, row in zip(sent, trainer, strict=True)
             for s, t, a in zip(datum.logprobs, row, datum.advantages, strict=True) if a != 0.0]
    if not diffs:
        return {}
    return {"rollout/logprob_mismatch": sum(diffs) / len(diffs), "rollout/logprob_mismatch_max": max(diffs)}
