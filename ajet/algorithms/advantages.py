"""Advantage estimators as pure functions over plain Python data (no torch).

Episode level: one reward per episode, grouped by `group_id` (the task: GRPO siblings).
Role level (`compute_role_advantages`, per-role rewards of multi-agent episodes): one reward
per (episode, role), grouped by (task, role), so each role is compared with itself.
Step level (REINFORCE++ with per-call rewards; GiGPO's state groups on top of GRPO): one value
per LLM call of the episode.
`assign_token_advantages` then spreads the values over each `Sample`'s trained tokens.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ajet.config.schema import Algorithm

if TYPE_CHECKING:
    from ajet.config.schema import AlgorithmConfig
    from ajet.context.types import Sample

logger = logging.getLogger(__name__)


def _group_indices(group_ids: Sequence[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        groups[gid].append(i)
    return groups


def _check_lengths(rewards: Sequence[float], group_ids: Sequence[str]) -> None:
    if len(rewards) != len(group_ids):
        raise ValueError(
            f"rewards ({len(rewards)}) and group_ids ({len(group_ids)}) must have one entry "
            "per episode"
        )


def _check_finite(
    episode_ids: Sequence[str],
    rewards: Sequence[float],
    step_rewards: Sequence[Sequence[float] | None] | None,
) -> None:
    """Refuse NaN/inf: one would turn every advantage of its group (or, for REINFORCE++, of the
    batch) into NaN and the weights with them. The rollout runner fails such episodes as
    `bad_output` / `judge_error:non_finite_reward`, so reaching this is a bug upstream."""
    for i, episode_id in enumerate(episode_ids):
        values = [rewards[i], *((step_rewards[i] or []) if step_rewards is not None else [])]
        bad = [v for v in values if not math.isfinite(float(v))]
        if bad:
            raise ValueError(
                f"episode {episode_id!r} has a non-finite reward ({bad[0]!r}); advantages need "
                "finite rewards. Fail such episodes before computing advantages"
            )


def _require_finite(rewards: Sequence[float]) -> None:
    for i, r in enumerate(rewards):
        if not math.isfinite(float(r)):
            raise ValueError(f"rewards[{i}] is {r!r}; advantages need finite rewards")


def grpo_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[str],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> list[float]:
    """GRPO: `(r - mean_group) / (std_group + eps)`, or `r - mean_group` (Dr.GRPO).

    The std is the unbiased one (n - 1 denominator), as `torch.std` in verl and TRL.
    A group of one episode has no baseline and gets advantage 0 (verl instead passes
    its raw reward through; a lone sample carries no relative signal, so we drop it).
    """
    _check_lengths(rewards, group_ids)
    _require_finite(rewards)
    out = [0.0] * len(rewards)
    for idx in _group_indices(group_ids).values():
        if len(idx) < 2:
            continue
        for i, value in zip(idx, _normalised([float(rewards[i]) for i in idx], norm_by_std, eps), strict=True):
            out[i] = value
    return out


def _normalised(values: list[float], norm_by_std: bool, eps: float) -> list[float]:
    """`(v - mean) / (std + eps)` over a group of 2 or more (unbiased std, n - 1), or `v - mean`."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return [(v - mean) / (std + eps) if norm_by_std else v - mean for v in values]


def rloo_advantages(rewards: Sequence[float], group_ids: Sequence[str]) -> list[float]:
    """RLOO: `r_i - mean(r_j for j != i)` within the group; a group of one gets 0."""
    _check_lengths(rewards, group_ids)
    _require_finite(rewards)
    out = [0.0] * len(rewards)
    for idx in _group_indices(group_ids).values():
        n = len(idx)
        if n < 2:
            continue
        total = sum(float(rewards[i]) for i in idx)
        for i in idx:
            r = float(rewards[i])
            out[i] = r - (total - r) / (n - 1)
    return out


def discounted_returns(step_rewards: Sequence[float], gamma: float) -> list[float]:
    """`G_t = sum_{k >= t} gamma^(k - t) * r_k` for one episode."""
    returns = [0.0] * len(step_rewards)
    running = 0.0
    for t in range(len(step_rewards) - 1, -1, -1):
        running = float(step_rewards[t]) + gamma * running
        returns[t] = running
    return returns


def _returns_with_final(steps: list[float], final: float, gamma: float) -> list[float]:
    """The discounted returns of an episode's step rewards, its final reward added to the last step."""
    _require_finite(steps)
    steps = [*steps[:-1], steps[-1] + float(final)]
    return discounted_returns(steps, gamma)


def reinforce_pp_advantages(
    rewards: Sequence[float],
    *,
    step_rewards: Sequence[Sequence[float] | None] | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> list[list[float]]:
    """REINFORCE++: discounted returns per step, whitened over the whole batch.

    Episode `i` has steps (its LLM calls, in call order) with rewards `step_rewards[i]`;
    its final reward `rewards[i]` is added to the last step. Without step rewards (or
    with `None`/`[]` for an episode) the episode is one step carrying its final reward.
    The returns of every step of every episode are then whitened together as verl's
    `masked_whiten` does: `(G - mean) / sqrt(var + eps)`, unbiased variance. verl
    whitens over tokens; here each step counts once (`assign_token_advantages` spreads
    a step's value over its tokens). A batch with a single step gets 0.
    """
    if step_rewards is not None and len(step_rewards) != len(rewards):
        raise ValueError(
            f"step_rewards ({len(step_rewards)}) must have one entry per episode "
            f"({len(rewards)} rewards)"
        )
    _require_finite(rewards)
    returns: list[list[float]] = []
    for i, final in enumerate(rewards):
        steps = list(step_rewards[i] or []) if step_rewards is not None else []
        returns.append(_returns_with_final([float(x) for x in steps] or [0.0], final, gamma))

    flat = [g for ep in returns for g in ep]
    n = len(flat)
    if n == 0:
        return returns
    mean = sum(flat) / n
    var = sum((g - mean) ** 2 for g in flat) / (n - 1) if n > 1 else 0.0
    scale = 1.0 / math.sqrt(var + eps)
    return [[(g - mean) * scale for g in ep] for ep in returns]


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
    _check_lengths(rewards, group_ids)
    _require_finite(rewards)
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
        returns.append(_returns_with_final(steps or [0.0] * n, rewards[i], gamma))
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
        values = _normalised([returns[i][t] for i, t in steps_of_state], norm_by_std, eps)
        for (i, t), step in zip(steps_of_state, values, strict=True):
            out[i][t] = episode[i] + weight * step
    stats = StateGroups(steps=sum(len(row) for row in out), marked=sum(len(m) for m in members.values()),
                        grouped=grouped, groups=len(members))
    return out, stats


def compute_advantages(
    config: AlgorithmConfig,
    episode_ids: Sequence[str],
    rewards: Sequence[float],
    group_ids: Sequence[str],
    step_rewards: Sequence[Sequence[float] | None] | None = None,
) -> dict[str, float] | dict[str, list[float]]:
    """Dispatch on `config.name`; returns `{episode_id: advantage or per-step advantages}`.

    PPO without a critic uses the GRPO group baseline, and so does distillation for the task
    reward's part (`ajet.algorithms.distill` scales it by `distill.reward_coef` and adds the
    teacher's). SFT and DPO have no advantages.
    """
    if len(episode_ids) != len(rewards):
        raise ValueError(f"episode_ids ({len(episode_ids)}) and rewards ({len(rewards)}) differ")
    _check_finite(episode_ids, rewards, step_rewards)
    name = Algorithm(config.name)
    if name in (Algorithm.grpo, Algorithm.ppo, Algorithm.distill):
        adv = grpo_advantages(rewards, group_ids, norm_by_std=config.norm_adv_by_std)
    elif name == Algorithm.rloo:
        adv = rloo_advantages(rewards, group_ids)
    elif name == Algorithm.reinforce_pp:
        per_step = reinforce_pp_advantages(rewards, step_rewards=step_rewards, gamma=config.gamma)
        return dict(zip(episode_ids, per_step, strict=True))
    else:
        raise ValueError(
            f"algorithm.name={name.value} uses no advantages; call compute_advantages only for "
            "grpo, rloo, reinforce_pp, ppo or distill"
        )
    return dict(zip(episode_ids, adv, strict=True))


def compute_role_advantages(
    config: AlgorithmConfig,
    episode_ids: Sequence[str],
    role_rewards: Sequence[Mapping[str, float]],
    group_ids: Sequence[str],
) -> dict[str, dict[str, float]]:
    """Per-role advantages: `{episode_id: {role: advantage}}`.

    Each role is its own estimation problem: role R's reward in episode i is compared with R's
    rewards in the other episodes of i's group (GRPO/RLOO: groups per (group_id, role); an
    episode without a reward for R is not in R's group). REINFORCE++ whitens each role's rewards
    over the batch (one step per episode and role: per-call rewards do not combine with
    per-role ones). A role rewarded in a single episode of its group gets 0, as a lone episode.
    """
    if len(episode_ids) != len(role_rewards) or len(episode_ids) != len(group_ids):
        raise ValueError(f"episode_ids ({len(episode_ids)}), role_rewards ({len(role_rewards)}) and "
                         f"group_ids ({len(group_ids)}) must have one entry per episode")
    out: dict[str, dict[str, float]] = {eid: {} for eid in episode_ids}
    for role in sorted({role for rewards in role_rewards for role in rewards}):
        idx = [i for i, rewards in enumerate(role_rewards) if role in rewards]
        ids = [episode_ids[i] for i in idx]
        adv = compute_advantages(config, ids, [float(role_rewards[i][role]) for i in idx],
                                 [group_ids[i] for i in idx])
        for eid, value in adv.items():
            out[eid][role] = float(value[0]) if isinstance(value, list) else float(value)
    return out


def assign_token_advantages(
    samples: Sequence[Sample],
    episode_advantages: dict[str, float] | dict[str, list[float]] | dict[str, dict[str, float]],
) -> None:
    """Fill `sample.advantage` per token: the episode's value on trained tokens, 0 elsewhere.

    Per-step values (a list per episode, indexed by call index) need the sample's
    `token_call_ids` (call index per token, -1 where untrained). Samples without that
    field fall back to the episode-level value: step 0's, the return of the whole episode.
    Per-role values (a dict per episode, `compute_role_advantages`) give a sample its role's
    value; a sample without trained tokens needs none.
    """
    warned = False
    for sample in samples:
        if sample.episode_id not in episode_advantages:
            raise KeyError(
                f"no advantage for episode {sample.episode_id!r}; compute advantages for every "
                "episode that produced samples"
            )
        value = episode_advantages[sample.episode_id]
        mask = sample.loss_mask
        if isinstance(value, dict):
            if sample.role not in value and any(mask):
                raise KeyError(
                    f"no advantage for role {sample.role!r} in episode {sample.episode_id!r} (roles with "
                    f"one: {sorted(value)}); every trained role needs a reward"
                )
            value = value.get(sample.role, 0.0)
        if not isinstance(value, list):
            sample.advantage = [float(value) if m else 0.0 for m in mask]
            continue
        if not value:
            raise ValueError(f"episode {sample.episode_id!r} has an empty list of step advantages")
        call_ids = getattr(sample, "token_call_ids", None)
        if not call_ids:
            if not warned:
                logger.warning(
                    "samples carry no token_call_ids; per-step advantages fall back to the "
                    "episode-level value (step 0)"
                )
                warned = True
            sample.advantage = [float(value[0]) if m else 0.0 for m in mask]
            continue
        if len(call_ids) != len(mask):
            raise ValueError(
                f"sample of episode {sample.episode_id!r}: token_call_ids ({len(call_ids)}) and "
                f"loss_mask ({len(mask)}) differ in length"
            )
        sample.advantage = [
            _step_value(value, c, sample.episode_id) if m else 0.0
            for m, c in zip(mask, call_ids, strict=True)
        ]


def _step_value(values: list[float], call_id: int, episode_id: str) -> float:
    if not 0 <= call_id < len(values):
        raise ValueError(
            f"episode {episode_id!r}: a trained token belongs to call {call_id} but only "
            f"{len(values)} step advantages were given (one per LLM call, in call order)"
        )
    return float(values[call_id])
