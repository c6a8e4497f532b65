"""Episodes -> trainable samples for the RL recipe: merge, advantages, budgets, weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from ajet.algorithms.advantages import (
    assign_token_advantages,
    compute_advantages,
    compute_role_advantages,
)
from ajet.algorithms.gigpo import gigpo_advantages
from ajet.config.schema import AlgorithmConfig, ContextConfig, StepCredit
from ajet.context.pack import loss_weights
from ajet.context.samples import episode_samples
from ajet.context.types import Sample
from ajet.rollout.episode import Episode
from ajet.rollout.roles import rewards_per_role

T = TypeVar("T")
# episode_id -> its advantage: a float, per-step values, or {role: advantage} (per-role rewards).
EpisodeAdvantages = dict[str, float] | dict[str, list[float]] | dict[str, dict[str, float]]


@dataclass
class StepBatch:
    samples: list[Sample]
    weights: list[list[float]]
    metrics: dict[str, float] = field(default_factory=dict)


def per_call(episode: Episode, values: list[T] | None, fill: T) -> list[T]:
    """`values` (the workflow's, in call order) to one per LLM call of `episode`: `fill` for the
    calls past the list, the values past the calls dropped."""
    calls = max(1, episode.num_calls)
    return (list(values or []) + [fill] * calls)[:calls]


def step_states(episode: Episode) -> list[str | None]:
    """The episode's state key per LLM call (`WorkflowOutput.step_states`); None: unmarked."""
    return per_call(episode, episode.output.step_states if episode.output is not None else None, None)


def padded_step_rewards(episode: Episode) -> list[float] | None:
    """`WorkflowOutput.step_rewards` to one per call (0 for calls past the list), or None."""
    given = episode.output.step_rewards if episode.output is not None else None
    return per_call(episode, given, 0.0) if given else None


def episode_advantages(episodes: list[Episode], algorithm: AlgorithmConfig, samples: list[Sample] | None = None,
                       metrics: dict[str, float] | None = None) -> EpisodeAdvantages:
    """episode_id -> advantage (a float, or per-step values for REINFORCE++ and step credit), or,
    when an episode has per-role rewards, {role: advantage} from groups per (task, role)
    (`compute_role_advantages`; an episode with a single reward counts it for each role of its
    group and of its `samples`). Step credit's counts go into `metrics`."""
    sample_roles: dict[str, set[str]] = {}
    for sample in samples or []:
        sample_roles.setdefault(sample.episode_id, set()).add(sample.role)
    per_role = rewards_per_role(episodes, lambda ep: sample_roles.get(ep.episode_id, ()))
    if per_role is not None:
        if algorithm.step_credit != StepCredit.none:
            raise ValueError("algorithm.step_credit needs one reward per episode; this batch has per-role rewards "
                             "(set algorithm.step_credit=none for multi-role training)")
        return compute_role_advantages(algorithm, [ep.episode_id for ep in episodes], per_role,
                                       [ep.group_id for ep in episodes])
    if algorithm.step_credit == StepCredit.gigpo:
        values, groups = gigpo_advantages(
            [float(ep.reward) for ep in episodes], [ep.group_id for ep in episodes],
            [step_states(ep) for ep in episodes],
            step_rewards=[padded_step_rewards(ep) for ep in episodes],
            gamma=algorithm.step_credit_gamma, weight=algorithm.step_credit_weight,
            norm_by_std=algorithm.norm_adv_by_std)
        if metrics is not None:
            metrics["credit/state_grouped_share"] = groups.grouped_share
            metrics["credit/state_group_size"] = groups.mean_group_size
            metrics["credit/state_marked_share"] = groups.marked_share
        return dict(zip([ep.episode_id for ep in episodes], values, strict=True))
    return compute_advantages(
        algorithm,
        [ep.episode_id for ep in episodes],
        [float(ep.reward) for ep in episodes],
        [ep.group_id for ep in episodes],
        step_rewards=[ep.output.step_rewards if ep.output is not None else None for ep in episodes],
    )


def build_step_batch(episodes: list[Episode], context: ContextConfig, algorithm: AlgorithmConfig,
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
        assign_token_advantages(samples, episode_advantages(episodes, algorithm, samples, metrics))
    metrics["context/samples"] = float(len(samples))
    for sample in samples:  # why the samples after an episode's first are separate (merge.BREAKS)
        if isinstance(name := sample.metadata.get("break"), str) and name:
            key = f"context/breaks/{name.replace(' ', '_')}"
            metrics[key] = metrics.get(key, 0.0) + 1.0
    return StepBatch(samples=samples, weights=loss_weights(samples, context.loss_agg), metrics=metrics)
