"""SFT on packed samples: one optimizer step, and per-sample loss without gradients.

Samples go through the same lossless tree packing as RL (`pack_samples` +
`forward_packed`): dialogs that share a system prompt forward it once. Loss weights
come from `loss_weights` over the whole batch before packing, so summing the
micro-batch losses is exactly the batch loss.
"""

from __future__ import annotations

from typing import Any

import torch

from ajet.algorithms.losses import sft_loss
from ajet.config.schema import LossAgg
from ajet.context.pack import loss_weights, pack_samples
from ajet.context.types import Sample
from ajet.forward.packed import forward_packed
from ajet.training.step import OptimizerStep, autocast


def sft_step(optimizer_step: OptimizerStep, samples: list[Sample], *, loss_agg: LossAgg | str,
             micro_batch_tokens: int, logits_chunk: int = 0, step: int | None = None) -> dict[str, float]:
    """Forward/backward every packed sequence of the batch, clip, step; return metrics."""
    weights = loss_weights(samples, loss_agg)
    packed = pack_samples(samples, weights, micro_batch_tokens)
    model = optimizer_step.model
    device = next(model.parameters()).device

    def seq_loss(seq: Any) -> tuple[torch.Tensor, dict[str, float]]:
        logp, _ = forward_packed(model, seq, logits_chunk=logits_chunk)
        return sft_loss(logp.float(), torch.tensor(seq.entry_weight, dtype=torch.float32, device=device)), {}

    result = optimizer_step.run(packed, seq_loss, step=step)
    return {
        "sft/loss": result.loss,
        "actor/grad_norm": result.grad_norm,
        "sft/trained_tokens": float(sum(sum(s.loss_mask) for s in samples)),
        "sft/tokens_packed": float(sum(p.num_tokens for p in packed)),
        "sft/tokens": float(sum(len(s.input_ids) for s in samples)),
    } | optimizer_step.metrics()


@torch.no_grad()
def sample_nll(model: torch.nn.Module, samples: list[Sample], *, micro_batch_tokens: int,
               bf16: bool = False, logits_chunk: int = 0) -> list[tuple[float, int]]:
    """Per sample: (summed NLL of its trained tokens, number of trained tokens)."""
    ones = [[1.0 if m else 0.0 for m in s.loss_mask] for s in samples]
    nll = [0.0] * len(samples)
    count = [sum(s.loss_mask) for s in samples]
    model.eval()
    for seq in pack_samples(samples, ones, micro_batch_tokens):
        if not seq.entry_pos:
            continue
        with autocast(model, bf16):
            logp, _ = forward_packed(model, seq, logits_chunk=logits_chunk)
        for index, value in zip(seq.entry_sample, logp.float().tolist(), strict=True):
            nll[index] -= value
    return list(zip(nll, count, strict=True))


def mean_nll(pairs: list[tuple[float, int]]) -> float:
    """Token-mean NLL over (sum, count) pairs; nan when there are no trained tokens."""
    tokens = sum(n for _, n in pairs)
    return sum(s for s, _ in pairs) / tokens if tokens else float("nan")
