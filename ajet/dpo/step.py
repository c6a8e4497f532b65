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

import contextlib
from typing import Any

import torch

from ajet.config.schema import AlgorithmConfig
from ajet.dpo.pairs import PairBatch, sequence_logps


def _autocast(model: torch.nn.Module, bf16: bool) -> Any:
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16)


def pack_pairs(batch: PairBatch, micro_batch_tokens: int) -> list[Any]:
    from ajet.context.pack import pack_samples

    ones = [[1.0 if m else 0.0 for m in s.loss_mask] for s in batch.samples]
    return pack_samples(batch.samples, ones, micro_batch_tokens)


@torch.no_grad()
def packed_sequence_logps(model: torch.nn.Module, packed: list[Any], batch: PairBatch, *, bf16: bool = False,
                          logits_chunk: int = 0) -> torch.Tensor:
    """Sequence log-probs of every paired episode under `model`, without gradients."""
    from ajet.context.packed_forward import forward_packed

    device = next(model.parameters()).device
    total = torch.zeros(len(batch.episode_ids), dtype=torch.float32, device=device)
    for seq in packed:
        if seq.entry_pos:
            with _autocast(model, bf16):
                logp, _ = forward_packed(model, seq, logits_chunk=logits_chunk)
            total += sequence_logps(logp.float(), _entry_seqs(seq, batch, device), len(batch.episode_ids))
    return total


def _entry_seqs(seq: Any, batch: PairBatch, device: torch.device) -> torch.Tensor:
    return torch.tensor([batch.sample_seq[i] for i in seq.entry_sample], dtype=torch.long, device=device)


def pair_loss(policy: torch.Tensor, ref: torch.Tensor | None, batch: PairBatch,
              algorithm: AlgorithmConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean DPO loss over the pairs from per-sequence log-probs, and its metrics."""
    from ajet.algorithms.dpo import dpo_loss

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


def dpo_step(model: torch.nn.Module, reference: Any, batch: PairBatch, optimizer: Any, algorithm: AlgorithmConfig,
             *, micro_batch_tokens: int, grad_clip: float, bf16: bool = False,
             logits_chunk: int = 0) -> dict[str, float]:
    """One optimizer step on the batch's pairs (see the module docstring)."""
    from ajet.context.packed_forward import forward_packed

    packed = pack_pairs(batch, micro_batch_tokens)
    ref = None
    if reference is not None and not algorithm.dpo_reference_free:
        ref = reference.ref_logprobs(packed_sequence_logps, packed, batch, bf16=bf16, logits_chunk=logits_chunk)
    model.eval()
    leaf = packed_sequence_logps(model, packed, batch, bf16=bf16, logits_chunk=logits_chunk).requires_grad_(True)
    loss, metrics = pair_loss(leaf, ref, batch, algorithm)
    (coef,) = torch.autograd.grad(loss, leaf)
    device = leaf.device
    model.train()
    try:
        optimizer.zero_grad(set_to_none=True)
        for seq in packed:
            if not seq.entry_pos:
                continue
            with _autocast(model, bf16):
                logp, _ = forward_packed(model, seq, logits_chunk=logits_chunk)
            surrogate = (coef[_entry_seqs(seq, batch, device)] * logp.float()).sum()
            surrogate.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], grad_clip)
        optimizer.step()
        # The gradients are spent: free them (as large as the weights) for what runs until the next
        # backward (rollout, evaluation, checkpoints) instead of keeping them to be overwritten.
        optimizer.zero_grad(set_to_none=True)
    finally:
        model.eval()
    metrics["actor/grad_norm"] = float(grad_norm)
    metrics["dpo/tokens_packed"] = float(sum(p.num_tokens for p in packed))
    return metrics
