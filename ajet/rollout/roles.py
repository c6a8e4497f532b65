"""Per-role rewards across episodes: who got what, whether a group can teach, the role metrics.

A workflow with several trained roles (multi-agent, self-play) may return
`WorkflowOutput(reward={"wolf": 1.0, "villager": 0.0})`: the episode then keeps the dict in
`Episode.role_rewards` and their mean in `Episode.reward`. Advantages are computed per (task,
role) group (`ajet.rl.samples`), so each role learns from how *its* reward varied across
the group's episodes. An episode of the same batch that returned a single reward counts it for
every role of its group.

A group has a learning signal when any of its roles' rewards differ across its episodes
(`has_signal`; dynamic sampling and `rollout.drop_equal_reward_groups` keep such groups): in
a zero-sum game the mean reward is the same in every episode, yet each side learns who won.

| metric | meaning (over the step's ok episodes) |
|---|---|
| `role/<name>/reward` | mean reward of the role, over the episodes that rewarded it |
| `role/<name>/success` | share of those episodes where the role's reward reached 1 (a single-reward episode: its `is_success`) |
| `role/<name>/calls` | LLM calls of the role per episode |
| `role/<name>/tokens` | completion tokens of the role per episode |

They are logged when there is more than one role, or a role other than "default".
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from ajet.rollout.episode import Episode

# Rewards closer than this count as equal when dropping groups without signal.
EQUAL_REWARD_TOL = 1e-8


def rewards_per_role(episodes: Sequence[Episode],
                     roles_of: Callable[[Episode], Iterable[str]] | None = None) -> list[dict[str, float]] | None:
    """Each episode's reward per role, or None when no episode has per-role rewards (then
    nothing is per role and the episodes' single rewards are used as they are).

    An episode with a single reward counts it for every role of its group: the roles rewarded
    in the group's other episodes, the roles that called the model in it, and `roles_of(episode)`
    (e.g. the roles of its samples)."""
    if not any(e.role_rewards for e in episodes):
        return None
    group_roles: dict[str, set[str]] = defaultdict(set)
    for e in episodes:
        group_roles[e.group_id].update(e.role_rewards)
    out: list[dict[str, float]] = []
    for e in episodes:
        if e.role_rewards:
            out.append(dict(e.role_rewards))
            continue
        roles = group_roles[e.group_id] | set(e.role_calls) | set(roles_of(e) if roles_of else ())
        out.append({role: float(e.reward) for role in roles})
    return out


def has_signal(group: Sequence[Episode]) -> bool:
    """Whether a group's rewards differ: any role's, with per-role rewards (an episode counts
    for the roles it has a reward for), else the episodes' single rewards."""
    per_role = rewards_per_role(group)
    if per_role is None:
        rows = [[e.reward for e in group]]
    else:
        roles = {role for rewards in per_role for role in rewards}
        rows = [[rewards[role] for rewards in per_role if role in rewards] for role in roles]
    return any(row and max(row) - min(row) > EQUAL_REWARD_TOL for row in rows)


def role_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """`role/<name>/{reward,success,calls,tokens}` over (ok) episodes; {} for a single-role run
    (one role, named "default", and no per-role reward)."""
    roles = sorted({role for e in episodes for role in (*e.role_rewards, *e.role_calls)})
    if not roles or (roles == ["default"] and not any(e.role_rewards for e in episodes)):
        return {}
    out: dict[str, float] = {}
    for role in roles:
        # (reward, success) of the episodes that rewarded the role; a single-reward episode
        # rewards the roles that called in it.
        scored = [(e.role_rewards[role], e.role_rewards[role] >= 1.0) if e.role_rewards
                  else (e.reward, e.is_success)
                  for e in episodes if role in e.role_rewards or (not e.role_rewards and role in e.role_calls)]
        if scored:
            out[f"role/{role}/reward"] = statistics.fmean(r for r, _ in scored)
            out[f"role/{role}/success"] = statistics.fmean(float(s) for _, s in scored)
        out[f"role/{role}/calls"] = statistics.fmean(e.role_calls.get(role, 0) for e in episodes)
        out[f"role/{role}/tokens"] = statistics.fmean(e.role_tokens.get(role, 0) for e in episodes)
    return out

