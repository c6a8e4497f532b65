"""What an algorithm declares (`AlgorithmSpec`), and the pieces its estimators share.

An algorithm is one file in `ajet/algorithms/` that defines its advantage estimator (plain Python
over rewards), its loss (over torch tensors, imported lazily: the registry is read whenever a
config loads) and a `SPEC`; `ajet.algorithms.registry` lists the specs. Everything that names
algorithms (the config's checks, the recipes, the GPU backbones' translations, error messages)
reads the registry.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor

    from ajet.config.schema import AjetConfig, AlgorithmConfig

# The recipe that trains an algorithm: the RL recipe (episodes, advantages, a policy loss), or
# the SFT and DPO recipes (their own data and losses).
Recipe = Literal["rl", "sft", "dpo"]
# episode ids, their rewards, their group ids (the task), per-call rewards (None: none given) ->
# {episode_id: advantage}, or {episode_id: one advantage per LLM call, in call order}.
Estimator = Callable[
    ["AlgorithmConfig", Sequence[str], Sequence[float], Sequence[str], Sequence[Sequence[float] | None] | None],
    "dict[str, float] | dict[str, list[float]]",
]
# The policy-gradient term of one packed sequence: (loss, metrics as entry means).
PolicyLoss = Callable[["LossInputs", "AlgorithmConfig"], "tuple[Tensor, dict[str, float]]"]
# Config problems, as (dotted key, what would be valid).
Problems = list[tuple[str, str]]
# Terms the RL update may add to the policy loss, each when its coefficient is set.
LOSS_TERMS = ("policy", "kl", "entropy")


@dataclass(frozen=True)
class LossInputs:
    """One packed sequence's loss entries (one per trained token), as 1-D tensors."""

    new: Tensor  # the trainer's logprobs now (with gradient)
    old: Tensor  # the logprobs the tokens were sampled with (or the trainer's, with TIS)
    advantages: Tensor
    weights: Tensor  # the loss weights (token_mean / seq_mean / episode_mean over the step)
    is_weights: Tensor | None = None  # truncated importance weights (algorithm.tis_cap), no gradient


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm, as everything outside its file sees it."""

    name: str  # `algorithm.name` and the pipeline stage's name
    summary: str  # one line: what it is (docs, error messages)
    recipe: Recipe
    advantages: Estimator | None = None  # the RL recipe's advantage estimator
    loss: PolicyLoss | None = None  # the RL recipe's policy loss of one packed sequence
    loss_terms: tuple[str, ...] = ()  # of LOSS_TERMS: what the update adds up
    needs_groups: bool = False  # compares the episodes of one task: needs rollout.n >= 2
    step_credit: tuple[str, ...] = ()  # the `algorithm.step_credit` choices it adds on top (gigpo)
    teacher: bool = False  # a teacher scores the samples before the update (on-policy distillation)
    # Its own checks of a config that trains it (a stage's, with the stage's overrides merged in).
    config_problems: Callable[[AjetConfig], Problems] | None = None
    # Its name in each remote backbone's own config ({"trinity": ..., "verl": ...}; for "tinker" the
    # service's built-in loss its policy loss is: "ppo" or "importance_sampling"); a backbone not
    # named does not train it, and `elsewhere` says why and what to use instead.
    backbone_names: Mapping[str, str] = field(default_factory=dict)
    elsewhere: str = ""

    def __post_init__(self) -> None:
        if self.recipe == "rl" and (self.advantages is None or self.loss is None):
            raise ValueError(f"algorithm {self.name!r}: an RL algorithm declares its advantages and its loss")
        unknown = set(self.loss_terms) - set(LOSS_TERMS)
        if unknown:
            raise ValueError(f"algorithm {self.name!r}: unknown loss terms {sorted(unknown)}; use {LOSS_TERMS}")


def clipped_policy_loss(inputs: LossInputs, config: AlgorithmConfig) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped surrogate (`ajet.algorithms.losses.policy_loss`): the GRPO family's loss."""
    # In the body: losses import torch, and the registry is read whenever a config loads.
    from ajet.algorithms.losses import policy_loss

    return policy_loss(inputs.new, inputs.old, inputs.advantages, inputs.weights,
                       clip_low=config.clip_ratio_low, clip_high=config.clip_ratio_high,
                       is_weights=inputs.is_weights)


# ---------------------------------------------------------------------- estimators' shared pieces
def group_indices(group_ids: Sequence[str]) -> dict[str, list[int]]:
    """group id -> the indices of its episodes, in order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        groups[gid].append(i)
    return groups


def check_lengths(rewards: Sequence[float], group_ids: Sequence[str]) -> None:
    if len(rewards) != len(group_ids):
        raise ValueError(
            f"rewards ({len(rewards)}) and group_ids ({len(group_ids)}) must have one entry "
            "per episode"
        )


def require_finite(rewards: Sequence[float]) -> None:
    for i, r in enumerate(rewards):
        if not math.isfinite(float(r)):
            raise ValueError(f"rewards[{i}] is {r!r}; advantages need finite rewards")


def normalised(values: list[float], norm_by_std: bool, eps: float) -> list[float]:
    """`(v - mean) / (std + eps)` over a group of 2 or more (unbiased std, n - 1), or `v - mean`."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return [(v - mean) / (std + eps) if norm_by_std else v - mean for v in values]


def discounted_returns(step_rewards: Sequence[float], gamma: float) -> list[float]:
    """`G_t = sum_{k >= t} gamma^(k - t) * r_k` for one episode."""
    returns = [0.0] * len(step_rewards)
    running = 0.0
    for t in range(len(step_rewards) - 1, -1, -1):
        running = float(step_rewards[t]) + gamma * running
        returns[t] = running
    return returns


def returns_with_final(steps: list[float], final: float, gamma: float) -> list[float]:
    """The discounted returns of an episode's step rewards, its final reward added to the last step."""
    require_finite(steps)
    steps = [*steps[:-1], steps[-1] + float(final)]
    return discounted_returns(steps, gamma)
