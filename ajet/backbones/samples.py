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
    """episode_id -> advantage (a float, or per-step list for REINFORCE++ with step rewards)."""
    from ajet.algorithms.advantages import grpo_advantages, reinforce_pp_advantages, rloo_advantages

    rewards = [float(ep.reward) for ep in episodes]
    groups = [ep.group_id for ep in episodes]
    ids = [ep.episode_id for ep in episodes]
    name = algorithm.name.value
    if name in ("grpo", "ppo"):
        values: list[Any] = grpo_advantages(rewards, groups, norm_by_std=algorithm.norm_adv_by_std)
    elif name == "rloo":
        values = rloo_advantages(rewards, groups)
    elif name == "reinforce_pp":
        step_rewards = [ep.output.step_rewards if ep.output is not None else None for ep in episodes]
        has_steps = any(s for s in step_rewards)
        per_step = reinforce_pp_advantages(
            rewards,
            step_rewards=[s or [r] for s, r in zip(step_rewards, rewards)] if has_steps else None,
            gamma=algorithm.gamma,
        )
        values = [steps if has_steps else steps[-1] for steps in per_step]
    else:
        raise ValueError(f"algorithm.name={name} is not an RL algorithm of the debug backbone's RL loop")
    return dict(zip(ids, values))


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
