"""GiGPO's step credit (arXiv 2505.10978), `algorithm.step_credit: gigpo` on top of GRPO: the steps
of one task's rollouts that act in the same marked state are compared by their discounted returns
(docs/credit.md)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ajet.algorithms.base import check_lengths, normalised, require_finite, returns_with_final
from ajet.algorithms.grpo import grpo_advantages


@dataclass(frozen=True)
class StateGroups:
    """How much step credit had to work with: `steps` calls in the batch, `marked` of them with a
    state key, `grouped` in a state group of 2 or more (only those get a step advantage), and the
    mean size of the state groups (all sizes, 1 included). `grouped == 0` means the states never
    repeat and step credit does nothing (a learning sign says so)."""

    steps: int
    marked: int
    grouped: int
    groups: int

    @property
    def grouped_share(self) -> float:
        return self.grouped / self.steps if self.steps else 0.0

    @property
    def marked_share(self) -> float:
        return self.marked / self.steps if self.steps else 0.0

    @property
    def mean_group_size(self) -> float:
        return self.marked / self.groups if self.groups else 0.0


def gigpo_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[str],
    step_states: Sequence[Sequence[str | None]],
    *,
    step_rewards: Sequence[Sequence[float] | None] | None = None,
    gamma: float = 0.95,
    weight: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[list[list[float]], StateGroups]:
    """GiGPO (arXiv 2505.10978): the episode's GRPO advantage plus `weight` times a step advantage
    computed inside "anchor state" groups. One value per LLM call of each episode, in call order.

    `step_states[i][t]` is the environment state that episode i's call t acted in (a key the
    workflow marks; None: not marked). Steps of the same task group (`group_ids`) with the same
    key form a state group, across the task's rollouts and within one episode (a state visited
    twice counts twice). A step's return is the discounted return from it,
    `G_t = sum_k gamma^k r_{t+k}`, with the episode's final reward added to its last step (as
    `reinforce_pp_advantages` does); its step advantage is `(G_t - mean) / (std + eps)` over its
    state group (`G_t - mean` without `norm_by_std`; unbiased std, as GRPO's). A step whose
    group has one member, or no key, gets the episode advantage alone.
    """
    check_lengths(rewards, group_ids)
    require_finite(rewards)
    if len(step_states) != len(rewards):
        raise ValueError(f"step_states ({len(step_states)}) must have one entry per episode ({len(rewards)} rewards)")
    if step_rewards is not None and len(step_rewards) != len(rewards):
        raise ValueError(f"step_rewards ({len(step_rewards)}) must have one entry per episode ({len(rewards)} rewards)")
    episode = grpo_advantages(rewards, group_ids, norm_by_std=norm_by_std, eps=eps)
    returns: list[list[float]] = []
    for i, states in enumerate(step_states):
        n = max(1, len(states))
        steps = [float(r) for r in (step_rewards[i] or [])] if step_rewards is not None else []
        if steps and len(steps) != len(states):
            raise ValueError(f"episode {i}: {len(steps)} step rewards for {len(states)} calls; give one per call")
        returns.append(returns_with_final(steps or [0.0] * n, rewards[i], gamma))
    members: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for i, states in enumerate(step_states):
        for t, key in enumerate(states):
            if key is not None:
                members[(group_ids[i], str(key))].append((i, t))
    out = [[episode[i]] * max(1, len(states)) for i, states in enumerate(step_states)]
    grouped = 0
    for steps_of_state in members.values():
        if len(steps_of_state) < 2:
            continue
        grouped += len(steps_of_state)
        values = normalised([returns[i][t] for i, t in steps_of_state], norm_by_std, eps)
        for (i, t), step in zip(steps_of_state, values, strict=True):
            out[i][t] = episode[i] + weight * step
    stats = StateGroups(steps=sum(len(row) for row in out), marked=sum(len(m) for m in members.values()),
                        grouped=grouped, groups=len(members))
    return out, stats
