"""Advantages of a step's episodes, whatever the algorithm: the dispatch to its estimator (the
registry's), per-role advantages, and the spread of each value over a sample's trained tokens.

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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ajet.algorithms.registry import get_algorithm, names

if TYPE_CHECKING:
    from ajet.config.schema import AlgorithmConfig
    from ajet.context.types import Sample

logger = logging.getLogger(__name__)


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


def compute_advantages(
    config: AlgorithmConfig,
    episode_ids: Sequence[str],
    rewards: Sequence[float],
    group_ids: Sequence[str],
    step_rewards: Sequence[Sequence[float] | None] | None = None,
) -> dict[str, float] | dict[str, list[float]]:
    """`{episode_id: advantage or per-step advantages}` from `config.name`'s estimator (the
    registry's). SFT and DPO have none."""
    if len(episode_ids) != len(rewards):
        raise ValueError(f"episode_ids ({len(episode_ids)}) and rewards ({len(rewards)}) differ")
    _check_finite(episode_ids, rewards, step_rewards)
    spec = get_algorithm(config.name)
    if spec.advantages is None:
        raise ValueError(
            f"algorithm.name={spec.name} uses no advantages; call compute_advantages only for "
            f"{', '.join(names(recipe='rl'))}"
        )
    return spec.advantages(config, episode_ids, rewards, group_ids, step_rewards)


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
