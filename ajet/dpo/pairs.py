"""Preference pairs from rollouts, and sequence log-probs over packed samples.

For each task (group) the episode with the best reward is *chosen* and the one with the
worst is *rejected*, only when their rewards differ (`build_preference_pairs`). An
episode's sequence is everything it trained: the completion tokens of all its calls
(merged into samples as for RL), and its sequence log-prob is their summed log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ajet.algorithms.dpo import build_preference_pairs
from ajet.config.schema import ContextConfig
from ajet.context.samples import episode_samples
from ajet.context.types import Sample

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class PairBatch:
    samples: list[Sample]  # the samples of every paired episode
    sample_seq: list[int]  # per sample: its sequence (= paired episode) index
    chosen: list[int]  # per pair: sequence index of the chosen episode
    rejected: list[int]  # per pair: sequence index of the rejected episode
    seq_tokens: list[int]  # per sequence: trained (completion) tokens
    episode_ids: list[str]  # per sequence
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def num_pairs(self) -> int:
        return len(self.chosen)


def build_pair_batch(episodes: Sequence[Any], context: ContextConfig, *, model_max_len: int) -> PairBatch:
    """Best-vs-worst pairs of the episodes' groups; pairs with an episode that trained nothing are skipped."""
    by_id = {ep.episode_id: ep for ep in episodes}
    candidates = build_preference_pairs([(ep.group_id, ep.episode_id, float(ep.reward)) for ep in episodes])
    batch = PairBatch([], [], [], [], [], [])
    skipped = 0
    cache: dict[str, list[Sample]] = {}
    for chosen_id, rejected_id in candidates:
        for episode_id in (chosen_id, rejected_id):
            if episode_id not in cache:
                samples, _ = episode_samples(by_id[episode_id], context, model_max_len)
                cache[episode_id] = [s for s in samples if any(s.loss_mask)]
        if not cache[chosen_id] or not cache[rejected_id]:
            skipped += 1
            continue
        seqs = []
        for episode_id in (chosen_id, rejected_id):
            seq = len(batch.episode_ids)
            batch.episode_ids.append(episode_id)
            batch.samples += cache[episode_id]
            batch.sample_seq += [seq] * len(cache[episode_id])
            batch.seq_tokens.append(sum(sum(s.loss_mask) for s in cache[episode_id]))
            seqs.append(seq)
        batch.chosen.append(seqs[0])
        batch.rejected.append(seqs[1])
    groups = len({ep.group_id for ep in episodes})
    batch.metrics = {"dpo/pairs": float(batch.num_pairs), "dpo/groups": float(groups),
                     "dpo/skipped_pairs": float(skipped)}
    return batch


def sequence_logps(entry_logprobs: Tensor, entry_seq: Tensor, num_seqs: int) -> Tensor:
    """Per sequence: the sum of its entries' log-probs (`entry_seq[i]` = sequence of entry i)."""
    import torch

    out = torch.zeros(num_seqs, dtype=entry_logprobs.dtype, device=entry_logprobs.device)
    return out.index_add(0, entry_seq, entry_logprobs)
