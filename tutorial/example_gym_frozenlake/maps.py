"""Each task's map for `gym_frozenlake*.yaml` (`env.gymnasium.task_args`): Gymnasium's own
`generate_random_map`, seeded by the task's seed, sized as ajet's frozenlake sizes its maps (mostly
4x4, every 4th seed 5x5) with its hole rate (0.2). The splits' seeds are disjoint, so val and test
hold maps that training never saw."""

from __future__ import annotations

from gymnasium.envs.toy_text.frozen_lake import generate_random_map


def random_map(seed: int) -> dict[str, list[str]]:
    return {"desc": generate_random_map(size=5 if seed % 4 == 0 else 4, p=0.8, seed=seed)}
