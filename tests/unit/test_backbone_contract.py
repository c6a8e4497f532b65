"""The backbone contract: capabilities as data, and the refusals derived from them."""

from __future__ import annotations

from ajet.algorithms.registry import backbone_algorithms
from ajet.backbones.registry import all_capabilities, backbone_problems
from ajet.config.schema import AjetConfig


def keys(problems: list[tuple[str, str]]) -> set[str]:
    return {key for key, _ in problems}


def test_each_backbone_declares_what_it_trains_and_gpu_ones_take_it_from_the_registry() -> None:
    caps = all_capabilities()
    assert set(caps) == {"debug", "trinity", "verl", "tinker"}
    assert caps["debug"].algorithms is None  # every registered algorithm
    for gpu in ("trinity", "verl"):
        assert caps[gpu].algorithms == tuple(backbone_algorithms(gpu)) == ("grpo", "rloo", "reinforce_pp")
    assert caps["tinker"].algorithms == tuple(backbone_algorithms("tinker")) == ("grpo", "rloo", "reinforce_pp", "ppo")


def test_a_staged_run_on_a_backbone_without_stages_is_refused_naming_the_one_with() -> None:
    """A pipeline on trinity used to train algorithm.name alone, the stages silently dropped."""
    cfg = AjetConfig()
    cfg.pipeline.stages = ["grpo", "eval"]
    assert backbone_problems("debug", cfg) == []
    for gpu in ("trinity", "verl"):
        message = dict(backbone_problems(gpu, cfg))["pipeline.stages"]
        assert "runs on --backbone=debug only" in message and "run each stage on its own" in message


def test_with_ray_is_refused_at_the_check_for_recipes_the_backbone_cannot_spread() -> None:
    cfg = AjetConfig()
    assert backbone_problems("debug", cfg, with_ray=True) == []
    cfg.algorithm.name = "dpo"
    cfg.rollout.n = 2
    (problem,) = [msg for key, msg in backbone_problems("debug", cfg, with_ray=True) if key == "--with-ray"]
    assert problem == "--with-ray is not implemented for the dpo recipe on --backbone=debug; run without it."
    cfg = AjetConfig()
    cfg.pipeline.stages = ["grpo", "eval"]
    assert "staged runs" in dict(backbone_problems("debug", cfg, with_ray=True))["--with-ray"]


def test_a_capability_every_backbone_has_is_never_refused_and_other_sections_are() -> None:
    cfg = AjetConfig()
    cfg.verl.n_gpus_per_node = 4
    trinity = dict(backbone_problems("trinity", cfg))
    assert "is a verl setting and has no effect on --backbone=trinity" in trinity["verl.n_gpus_per_node"]
    assert "verl.n_gpus_per_node" not in keys(backbone_problems("verl", cfg))


def test_the_docs_table_is_the_capabilities() -> None:
    """docs/backbones.md shows every backbone's declared capabilities."""
    from pathlib import Path

    from ajet.backbones.registry import capabilities_table

    docs = (Path(__file__).parents[2] / "docs" / "backbones.md").read_text()
    assert capabilities_table() in docs


def test_another_backbones_setting_is_refused_once_on_the_debug_backbone() -> None:
    cfg = AjetConfig()
    cfg.trinity.explorer_gpus = 2
    problems = backbone_problems("debug", cfg)
    assert [key for key, _ in problems] == ["trinity.explorer_gpus"]
    assert "is a trinity setting and has no effect on --backbone=debug" in problems[0][1]


def test_kept_matmuls_are_refused_where_the_trainer_is_not_ajets() -> None:
    cfg = AjetConfig()
    cfg.trainer.checkpoint_keep_matmuls = True
    assert "trainer.checkpoint_keep_matmuls" not in keys(backbone_problems("debug", cfg))
    for other in ("trinity", "verl", "tinker"):
        message = dict(backbone_problems(other, cfg))["trainer.checkpoint_keep_matmuls"]
        assert "runs on --backbone=debug only" in message and "set it to false" in message
