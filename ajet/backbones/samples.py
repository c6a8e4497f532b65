"""Episodes -> trainable samples, shared by every backbone: merge, advantages, budgets, weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ajet.algorithms.advantages import assign_token_advantages, compute_advantages
from ajet.config.schema import AlgorithmConfig, ContextConfig
from ajet.context.pack import loss_weights
from ajet.context.samples import episode_samples
from ajet.context.types import Sample


@dataclass
class StepBatch:
    samples: list[Sample]
    weights: list[list[float]]
    metrics: dict[str, float] = field(default_factory=dict)


def episode_advantages(episodes: list[Any], algorithm: AlgorithmConfig) -> dict[str, Any]:
    """episode_id -> advantage (a float, or per-step values for REINFORCE++)."""
    return compute_advantages(
        algorithm,
        [ep.episode_id for ep in episodes],
        [float(ep.reward) for ep in episodes],
        [ep.group_id for ep in episodes],
        step_rewards=[ep.output.step_rewards if ep.output is not None else None for ep in episodes],
    )


def build_step_batch(episodes: list[Any], context: ContextConfig, algorithm: AlgorithmConfig,
                     *, model_max_len: int) -> StepBatch:
    """Each episode's samples (`episode_samples`: merged, within budgets), their advantages, the loss weights."""
    samples: list[Sample] = []
    overflow: dict[str, float] = {}
    for ep in episodes:
        pieces, counts = episode_samples(ep, context, model_max_len)
        samples.extend(pieces)
        for key, value in counts.items():
            overflow[key] = overflow.get(key, 0.0) + value
    metrics: dict[str, float] = {f"context/{k}": float(v) for k, v in overflow.items()}
    if episodes:
        assign_token_advantages(samples, episode_advantages(episodes, algorithm))
    metrics["context/samples"] = float(len(samples))
    return StepBatch(samples=samples, weights=loss_weights(samples, context.loss_agg), metrics=metrics)
