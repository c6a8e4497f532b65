"""Per-token losses over 1-D tensors of *loss entries* (one trained token of one sample).

Every loss is `sum(weight * per_entry_loss)`: the weights already carry the
normalisation (token_mean / seq_mean / episode_mean over the global batch), so summing
over micro-batches gives the batch loss. `token_logprobs` turns final hidden states into
those per-entry log-probs (optionally in chunks). This module imports torch; import it lazily.
"""

from __future__ import annotations

import torch
from torch import Tensor

# verl clamps log-ratios to this range before exp() so one bad token cannot overflow.
_LOG_RATIO_CLAMP = 20.0
POLICY_LOSS_MODES = ("ppo", "dual_clip")
KL_KINDS = ("k1", "k2", "k3")


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"loss inputs must have one value per loss entry, got shapes {shapes}")


def policy_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    mode: str = "ppo",
    clip_c: float = 3.0,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate `-min(r*A, clip(r, 1-clip_low, 1+clip_high)*A)`, weighted sum.

    `r = exp(new - old)`. On-policy single-epoch GRPO has r == 1 in value, but the same
    formula still gives the gradient `-A * d(new)` through r. `mode="dual_clip"` also
    bounds the loss of negative-advantage tokens by `-clip_c * A` (verl's dual-clip PPO).
    `is_weights` (e.g. `tis_weights`) multiply each entry's loss; they carry no gradient.

    Metrics (unweighted means over the given entries): `clip_frac` (share of entries
    where the clipped term is the one taken), `approx_kl` (k3 estimate of KL(old||new)),
    `ratio_mean`, `n_entries`.
    """
    _check_same_shape(new=new_logprobs, old=old_logprobs, adv=advantages, w=weights)
    if mode not in POLICY_LOSS_MODES:
        raise ValueError(f"policy loss mode {mode!r} unknown; use one of {POLICY_LOSS_MODES}")
    log_ratio = torch.clamp(new_logprobs - old_logprobs, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_entry = torch.maximum(unclipped, clipped)
    if mode == "dual_clip":
        if clip_c <= 1.0:
            raise ValueError(f"dual-clip needs clip_c > 1, got {clip_c}")
        bounded = torch.minimum(per_entry, -advantages * clip_c)
        per_entry = torch.where(advantages < 0, bounded, per_entry)
    if is_weights is not None:
        _check_same_shape(new=new_logprobs, is_weights=is_weights)
        per_entry = per_entry * is_weights.detach()
    loss = (weights * per_entry).sum()

    with torch.no_grad():
        n = new_logprobs.numel()
        metrics = {
            "clip_frac": float((clipped > unclipped).float().mean()) if n else 0.0,
            # tokens were sampled from old: k3 of KL(old || new) is exp(new-old) - (new-old) - 1
            "approx_kl": float(kl_penalty(old_logprobs, new_logprobs, "k3").mean()) if n else 0.0,
            "ratio_mean": float(ratio.mean()) if n else 0.0,
            "n_entries": float(n),
        }
    return loss, metrics


def tis_weights(trainer_logprobs: Tensor, engine_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling (TIS): per entry `min(exp(trainer - engine), cap)`, no
    gradient.

    The engine sampled the tokens with its own numerics (a bf16 copy of the weights, other
    kernels), so they come from a slightly different policy than the trainer's at the same
    weights. Weighting each entry's policy-gradient term by the ratio of the two makes the
    gradient the trainer's policy's; the cap bounds its variance. As in "Your efficient RL
    framework secretly brings you off-policy RL training" (Yao et al., 2025) and verl's
    `tis_imp_ratio_cap`; the PPO ratio is then taken against the trainer's old logprobs.
    """
    _check_same_shape(trainer=trainer_logprobs, engine=engine_logprobs)
    if cap <= 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    log_ratio = torch.clamp(trainer_logprobs - engine_logprobs, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(log_ratio.detach()), max=cap)


def kl_penalty(new_logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-entry estimate of KL(new || ref) from sampled tokens (Schulman's k1/k2/k3).

    k1 = new - ref; k2 = (new - ref)^2 / 2; k3 = exp(ref - new) - (ref - new) - 1, the
    low-variance, non-negative estimator of GRPO / verl `low_var_kl`, clamped as verl
    does (log-ratio to [-20, 20], result to [-10, 10]). Add `kl_coef * sum(weight * kl)`.
    """
    _check_same_shape(new=new_logprobs, ref=ref_logprobs)
    if kind == "k1":
        return new_logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (new_logprobs - ref_logprobs).square()
    if kind == "k3":
        log_ratio = torch.clamp(ref_logprobs - new_logprobs, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)
    raise ValueError(f"kl kind {kind!r} unknown; use one of {KL_KINDS}")


def sft_loss(new_logprobs: Tensor, weights: Tensor) -> Tensor:
    """Weighted negative log-likelihood: `-sum(weight * logprob)`."""
    _check_same_shape(new=new_logprobs, w=weights)
    return -(weights * new_logprobs).sum()
