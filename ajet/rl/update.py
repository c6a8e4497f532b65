"""The RL recipe's weight update: packed sequences in, one optimizer step out. The loss of a
sequence is the algorithm's own (`AlgorithmSpec.loss`, e.g. PPO's clipped surrogate) plus the
terms it declares (KL, entropy); `loss.backward()` and `optimizer.step()` are in `update`.

Loss weights are normalised over the whole step before packing, so summing the
micro-batch losses gives exactly the full-batch gradient (accumulation is exact).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from ajet.algorithms.base import LossInputs, PolicyLoss
from ajet.algorithms.losses import kl_penalty, tis_weights
from ajet.algorithms.reference import build_reference
from ajet.algorithms.registry import get_algorithm
from ajet.config.schema import AlgorithmConfig, TrainerConfig
from ajet.context.pack import PackedSequence
from ajet.forward.packed import forward_packed
from ajet.training.adapters import reference_adapter
from ajet.training.step import OptimizerStep

log = logging.getLogger(__name__)


class PolicyUpdater:
    """The policy-gradient step over packed sequences, and the (optional) KL reference. The
    optimizer comes from the recipe (`ajet.training.optim`); the training loop steps its schedule."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: TrainerConfig,
                 algorithm: AlgorithmConfig, *, temperature: float, per_role_adapters: bool = False) -> None:
        self.model = model
        self.optimizer = optimizer
        self.trainer = trainer
        self.algorithm = algorithm
        self.spec = get_algorithm(algorithm.name)
        if self.spec.loss is None:
            raise ValueError(f"algorithm.name={algorithm.name} has no policy loss: it is not an RL algorithm")
        self.policy_loss: PolicyLoss = self.spec.loss
        self.temperature = temperature
        # Per-role LoRA adapters (`model.lora.per_role`): each sequence (one role's samples,
        # `pack_samples(by_role=True)`) is forwarded through its role's adapter; the KL reference
        # is the base with every adapter disabled (lora_base) or the role's initial adapter (frozen).
        self.optimizer_step = OptimizerStep(model, optimizer, trainer, per_role_adapters=per_role_adapters)
        # Built before the first update: a frozen copy of the initial weights, or the base with LoRA off.
        self.reference = build_reference(model, algorithm)

    def update(self, packed: list[PackedSequence], *, step: int | None = None) -> dict[str, float]:
        """One optimizer step (per PPO epoch) over all packed sequences of the step."""
        totals: dict[str, float] = {}
        # The trainer's logprobs of each sequence before the first optimizer step (the weights
        # the engine sampled with, in the trainer's precision); `old` holds the engine's.
        trainer_old: dict[int, torch.Tensor] = {}
        mismatch = _Mismatch()
        for _epoch in range(self.trainer.ppo_epochs):
            with self.optimizer_step.update(step) as update:
                for index, seq in enumerate(packed):
                    if not seq.entry_pos:
                        continue
                    with update.forward(seq):
                        loss, terms = self.sequence_loss(seq, index, trainer_old, mismatch, totals)
                    if update.finite(loss, terms):
                        loss.backward()
                if update.clip_gradients():
                    self.optimizer.step()
                    update.check_weights()
            totals["actor/grad_norm"] = update.result.grad_norm
        epochs = self.trainer.ppo_epochs
        out = {k: (v / epochs if k != "actor/grad_norm" else v) for k, v in totals.items()}
        return out | mismatch.metrics() | self.optimizer_step.metrics()

    def sequence_loss(self, seq: PackedSequence, index: int, trainer_old: dict[int, torch.Tensor],
                      mismatch: _Mismatch, totals: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of packed sequence `index`: the algorithm's policy loss (`AlgorithmSpec.loss`),
        plus `kl_coef` x KL to the reference and minus `entropy_coef` x entropy when the algorithm
        has those terms; its named terms, checked for NaN/inf. Adds its metrics to `totals`."""
        device = next(self.model.parameters()).device
        old = torch.tensor(seq.entry_old_logprob, dtype=torch.float32, device=device)
        adv = torch.tensor(seq.entry_advantage, dtype=torch.float32, device=device)
        weight = torch.tensor(seq.entry_weight, dtype=torch.float32, device=device)
        new, entropy = forward_packed(self.model, seq, with_entropy=True, temperature=self.temperature,
                                      logits_chunk=self.trainer.logits_chunk_tokens)
        new = new.float()
        if index not in trainer_old:
            trainer_old[index] = new.detach()
            mismatch.add(trainer_old[index], old)
        is_weights = None
        if self.algorithm.tis_cap > 0:  # TIS: correct for the engine's numerics, ratio against the trainer's
            is_weights = tis_weights(trainer_old[index], old, self.algorithm.tis_cap)
            _add(totals, "actor/tis_weight", float((weight * is_weights).sum()))
            old = trainer_old[index]
        loss, metrics = self.policy_loss(LossInputs(new=new, old=old, advantages=adv, weights=weight,
                                                    is_weights=is_weights), self.algorithm)
        terms: dict[str, float] = {}
        if self.algorithm.kl_coef > 0 and "kl" in self.spec.loss_terms:
            kl = kl_penalty(new, self._reference_logprobs(seq), kind="k3")
            terms["kl"] = float((weight * kl).detach().sum())
            loss = loss + self.algorithm.kl_coef * (weight * kl).sum()
            _add(totals, "actor/kl", terms["kl"])
        if self.algorithm.entropy_coef and entropy is not None and "entropy" in self.spec.loss_terms:
            loss = loss - self.algorithm.entropy_coef * (weight * entropy.float()).sum()
        _add(totals, "actor/loss", float(loss.detach()))
        if entropy is not None:
            _add(totals, "actor/entropy", float((weight * entropy.detach().float()).sum()))
        for key, value in metrics.items():
            if key != "n_entries":  # entry means, weighted by the sequence's share of the step's loss weight
                _add(totals, f"actor/{key}", float(value) * float(weight.sum()))
        return loss, terms

    def _reference_logprobs(self, seq: PackedSequence) -> torch.Tensor:
        reference = self.reference
        assert reference is not None

        def forward(model: torch.nn.Module, packed: PackedSequence, *, with_entropy: bool, temperature: float,
                    logits_chunk: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            own_role = self.optimizer_step.per_role_adapters and reference.kind == "frozen"  # the role's own initial policy
            with reference_adapter(model, packed.role) if own_role else contextlib.nullcontext():
                return forward_packed(model, packed, with_entropy=with_entropy, temperature=temperature,
                                      logits_chunk=logits_chunk)

        ref, _ = reference.ref_logprobs(forward, seq, with_entropy=False, temperature=self.temperature,
                                        logits_chunk=self.trainer.logits_chunk_tokens)
        return ref.float()


class _Mismatch:
    """Engine-vs-trainer logprob mismatch over the step's trained tokens: what sampling with
    other numerics (`rollout.engine_dtype`) costs; ~0 when both run the same fp32 weights
    (and larger for samples made by older weights, if any)."""

    def __init__(self) -> None:
        self.total, self.count, self.max = 0.0, 0, 0.0

    def add(self, trainer: torch.Tensor, engine: torch.Tensor) -> None:
        diff = (trainer - engine).abs()
        if diff.numel():
            self.total += float(diff.sum())
            self.count += diff.numel()
            self.max = max(self.max, float(diff.max()))

    def metrics(self) -> dict[str, float]:
        if not self.count:
            return {}
        return {"rollout/logprob_mismatch": self.total / self.count, "rollout/logprob_mismatch_max": self.max}


def _add(totals: dict[str, float], key: str, value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value
