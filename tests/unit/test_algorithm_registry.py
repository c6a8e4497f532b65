"""The algorithm registry: a new algorithm is one file (here, this one's toy) plus one entry
(`register`), and the config, the RL recipe and the backbones' checks take it from there."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from ajet.algorithms import registry
from ajet.algorithms.base import AlgorithmSpec, LossInputs
from ajet.config import ConfigError, load_config
from ajet.config.schema import AjetConfig, AlgorithmConfig

CALLS: list[int] = []


# ---------------------------------------------------------------------- the toy algorithm's file
def toy_advantages(config: AlgorithmConfig, episode_ids: Sequence[str], rewards: Sequence[float],
                   group_ids: Sequence[str], step_rewards: Sequence[Sequence[float] | None] | None,
                   ) -> dict[str, float]:
    """Plain REINFORCE: the reward itself, no baseline (so one episode per task is enough)."""
    return {episode_id: float(reward) for episode_id, reward in zip(episode_ids, rewards, strict=True)}


def toy_loss(inputs: LossInputs, config: AlgorithmConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """`-sum(weight * advantage * logprob)`: no ratio, no clipping."""
    CALLS.append(inputs.new.numel())
    return -(inputs.weights * inputs.advantages * inputs.new).sum(), {"toy_entries": float(inputs.new.numel())}


TOY = AlgorithmSpec(name="toy_reinforce", summary="REINFORCE without a baseline (a test's toy)", recipe="rl",
                    advantages=toy_advantages, loss=toy_loss, loss_terms=("policy",))


# ---------------------------------------------------------------------- its entry
@pytest.fixture()
def toy() -> Iterator[AlgorithmSpec]:
    registry.register(TOY)
    CALLS.clear()
    try:
        yield TOY
    finally:
        registry.unregister(TOY.name)


def _cfg(conf: Path, tmp_path: Path, *extra: str) -> AjetConfig:
    return load_config(conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true", "logging.tensorboard=false",
                              "trainer.total_steps=1", "trainer.batch_size=1", "trainer.val_every=0",
                              "trainer.save_final_model=false", "trainer.lr=0.01",
                              *extra])


def test_an_unregistered_algorithm_is_refused_with_the_choices(two_calls_conf: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"algorithm.name: Invalid value 'toy_reinforce', expected one of \[sft, "):
        _cfg(two_calls_conf, tmp_path, "algorithm.name=toy_reinforce")
    with pytest.raises(ConfigError, match=r"pipeline.stages\[1\]: Invalid value 'toy_reinforce'.*eval\]"):
        _cfg(two_calls_conf, tmp_path, "pipeline.stages=[grpo,toy_reinforce]")


def test_a_toy_algorithm_in_one_file_and_one_entry_trains_a_step(
        toy: AlgorithmSpec, two_calls_conf: Path, tmp_path: Path) -> None:
    """TwoCalls scores every episode 0.25: GRPO would see no signal (equal rewards in a group), the
    toy's baseline-free advantage does, so the step updates the weights with the toy's loss."""
    from ajet.rl.recipe import train

    cfg = _cfg(two_calls_conf, tmp_path, f"algorithm.name={toy.name}", "rollout.n=1")
    run_dir = train(cfg)
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "actor/skipped_update" not in row
    assert CALLS and row["actor/toy_entries"] > 0  # the toy's loss ran, its metrics reached the log
    assert row["actor/grad_norm"] > 0
    assert "actor/kl" not in row and "actor/clip_frac" not in row  # only the toy's own terms


def test_the_toy_needs_no_groups_and_the_gpu_backbones_refuse_it_by_name(
        toy: AlgorithmSpec, two_calls_conf: Path, tmp_path: Path) -> None:
    from ajet.backbones.registry import backbone_problems

    cfg = _cfg(two_calls_conf, tmp_path, f"algorithm.name={toy.name}", "rollout.n=1")  # no group check
    problems = dict(backbone_problems("verl", cfg))
    assert problems["algorithm.name"].startswith("=toy_reinforce does not run on --backbone=verl")
    assert "(the verl backbone trains grpo, rloo, reinforce_pp)" in problems["algorithm.name"]
    with pytest.raises(ConfigError, match="rollout.n.*grpo compares episodes of the same task.*reinforce_pp, ppo, "
                                          "distill, toy_reinforce"):
        _cfg(two_calls_conf, tmp_path, "algorithm.name=grpo", "rollout.n=1")


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.get_algorithm("grpo"))
    with pytest.raises(ValueError, match="built in"):
        registry.unregister("grpo")
    with pytest.raises(ValueError, match="declares its advantages and its loss"):
        AlgorithmSpec(name="half", summary="", recipe="rl", advantages=toy_advantages)


def test_the_docs_table_is_the_registry() -> None:
    """docs/algorithms.md shows the registry's table; a new algorithm without its row fails here
    (regenerate: `python -c "from ajet.algorithms.registry import markdown_table; print(markdown_table())"`)."""
    docs = (Path(__file__).parents[2] / "docs" / "algorithms.md").read_text()
    assert registry.markdown_table() in docs
