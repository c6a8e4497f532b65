"""Episodes -> trainable samples, shared by every backbone: merge, advantages, budgets, weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ajet.config.schema import AlgorithmConfig, ContextConfig
from ajet.context.types import Sample


@dataclass
class StepBatch:
    samples: list[Sample]
    weights: list[list[float]]
    metrics: dict[str, float] = field(default_factory=dict)


def episode_advantages(episodes: list[Any], algorithm: AlgorithmConfig) -> dict[str, Any]:
    """episode_id -> advantage (a float, or per-step values for REINFORCE++)."""
    from ajet.algorithms.advantages import compute_advantages

    return compute_advantages(
        algorithm,
        [ep.episode_id for ep in episodes],
        [float(ep.reward) for ep in episodes],
        [ep.group_id for ep in episodes],
        step_rewards=[ep.output.step_rewards if ep.output is not None else None for ep in episodes],
    )


def build_step_batch(episodes: list[Any], context: ContextConfig, algorithm: AlgorithmConfig,
                     *, model_max_len: int) -> StepBatch:
    """Merge each episode's timelines into samples, attach advantages, apply budgets and weights."""
    from ajet.algorithms.advantages import assign_token_advantages
    from ajet.context.budget import apply_budget
    from ajet.context.merge import merge_timelines, timelines_to_samples
    from ajet.context.pack import loss_weights

    samples: list[Sample] = []
    for ep in episodes:
        timelines = merge_timelines(ep.timelines) if context.merge else ep.timelines
        samples.extend(
            timelines_to_samples(timelines, episode_id=ep.episode_id, group_id=ep.group_id, reward=float(ep.reward))
        )
    metrics: dict[str, float] = {"context/samples_before_budget": float(len(samples))}
    if episodes:
        assign_token_advantages(samples, episode_advantages(episodes, algorithm))
    samples, overflow = apply_budget(samples, context, model_max_len)
    metrics.update({f"context/{k}": float(v) for k, v in overflow.items()})
    metrics["context/samples"] = float(len(samples))
    return StepBatch(samples=samples, weights=loss_weights(samples, context.loss_agg), metrics=metrics)
