"""One DPO update over packed pair samples, exact under micro-batching.

The DPO loss is not a sum over tokens: a pair's loss needs the whole chosen and rejected
sequence log-probs. So the step runs in two passes:
1. without gradients, the policy's (and the reference's) sequence log-probs over every
   packed micro-batch, then the loss and its gradient `g_s = dL/d logp_s` per sequence
   (a tiny autograd graph over one number per sequence);
2. with gradients, each micro-batch again, backpropagating `sum_entries g_seq(entry) * logp`.
By the chain rule the summed gradient equals that of the loss on one big batch (with
dropout off), at the cost of one extra forward without gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from ajet.algorithms.dpo import dpo_loss
from ajet.config.schema import AlgorithmConfig
from ajet.context.pack import pack_samples
from ajet.dpo.pairs import PairBatch, sequence_logps
from ajet.forward.packed import forward_packed
from ajet.training.step import OptimizerStep, autocast


def pack_pairs(batch: PairBatch, micro_batch_tokens: int) -> list[Any]:
    ones = [[1.0 if m else 0.0 for m in s.loss_mask] for s in batch.samples]
    return pack_samples(batch.samples, ones, micro_batch_tokens)


@torch.no_grad()
def packed_sequence_logps(model: torch.nn.Module, packed: list[Any], batch: PairBatch, *, bf16: bool = False,
                          logits_chunk: int = 0) -> torch.Tensor:
    """Sequence log-probs of every paired episode under `model`, without gradients."""
    device = next(model.parameters()).device
    total = torch.zeros(len(batch.episode_ids), dtype=torch.float32, device=device)
    for seq in packed:
        if seq.entry_pos:
            with autocast(model, bf16):
                logp, _ = forward_packed(model, seq, logits_chunk=logits_chunk)
            total += sequence_logps(logp.float(), _entry_seqs(seq, batch, device), len(batch.episode_ids))
    return total


def _entry_seqs(seq: Any, batch: PairBatch, device: torch.device) -> torch.Tensor:
    return torch.tensor([batch.sample_seq[i] for i in seq.entry_sample], dtype=torch.long, device=device)


def pair_loss(policy: torch.Tensor, ref: torch.Tensor | None, batch: PairBatch,
              algorithm: AlgorithmConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean DPO loss over the pairs from per-sequence log-probs, and its metrics."""
    if algorithm.dpo_loss == "ipo":  # length-averaged log-likelihood (as TRL)
        tokens = torch.tensor(batch.seq_tokens, dtype=policy.dtype, device=policy.device).clamp(min=1)
        policy = policy / tokens
        ref = None if ref is None else ref / tokens
    c, r = torch.tensor(batch.chosen), torch.tensor(batch.rejected)
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        policy[c], policy[r], None if ref is None else ref[c], None if ref is None else ref[r],
        beta=algorithm.dpo_beta, loss_type=algorithm.dpo_loss,
        label_smoothing=algorithm.dpo_label_smoothing, reference_free=algorithm.dpo_reference_free,
    )
    loss = losses.mean()
    metrics = {
        "dpo/loss": float(loss.detach()),
        "dpo/accuracy": float((chosen_rewards > rejected_rewards).float().mean()),
        "dpo/margin": float((chosen_rewards - rejected_rewards).mean()),
        "dpo/chosen_logp": float(policy[c].detach().mean()),
        "dpo/rejected_logp": float(policy[r].detach().mean()),
    }
    return loss, metrics


def dpo_step(optimizer_step: OptimizerStep, reference: Any, batch: PairBatch, algorithm: AlgorithmConfig,
             *, micro_batch_tokens: int, logits_chunk: int = 0, step: int | None = None) -> dict[str, float]:
    """One optimizer step on the batch's pairs (see the module docstring)."""
    model, bf16 = optimizer_step.model, optimizer_step.bf16
    packed = pack_pairs(batch, micro_batch_tokens)
    ref = None
    if reference is not None and not algorithm.dpo_reference_free:
        ref = reference.ref_logprobs(packed_sequence_logps, packed, batch, bf16=bf16, logits_chunk=logits_chunk)
    model.eval()
    leaf = packed_sequence_logps(model, packed, batch, bf16=bf16, logits_chunk=logits_chunk).requires_grad_(True)
    loss, metrics = pair_loss(leaf, ref, batch, algorithm)
    (coef,) = torch.autograd.grad(loss, leaf)
    device = leaf.device

    def seq_loss(seq: Any) -> tuple[torch.Tensor, dict[str, float]]:
        logp, _ = forward_packed(model, seq, logits_chunk=logits_chunk)
        # The surrogate whose gradient is the DPO loss's; its value is not the loss.
        return (coef[_entry_seqs(seq, batch, device)] * logp.float()).sum(), {"dpo loss": metrics["dpo/loss"]}

    result = optimizer_step.run(packed, seq_loss, step=step)
    metrics["actor/grad_norm"] = result.grad_norm
    metrics["dpo/tokens_packed"] = float(sum(p.num_tokens for p in packed))
    return metrics | optimizer_step.metrics()
