"""Stage-aware config: which stages a run executes, their checks,.

A run executes `pipeline.stages`, or the one `algorithm.name`. Each stage runs with the run's
config plus `pipeline.overrides[<stage>]`. Pure config work, nothing heavy is imported: it runs
at load time (`ajet.config.validate`); `ajet.pipeline` builds each stage's config from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ajet.config.ranges import range_problems
from ajet.config.schema import AjetConfig, ReferenceModel, Stage


def stage_names(cfg: AjetConfig) -> list[Stage]:
    """The stages a run executes: `pipeline.stages`, or the one `algorithm.name`."""
    return [Stage(s) for s in cfg.pipeline.stages] or [Stage(cfg.algorithm.name.value)]


def needs_workflow(cfg: AjetConfig) -> bool:
    """Every stage but SFT runs the workflow (rollouts or evaluation)."""
    return any(stage != Stage.sft for stage in stage_names(cfg))


def stage_problems(cfg: AjetConfig) -> list[tuple[str, str]]:
    """Config problems of the stages the run executes, as (dotted key, what would be valid)."""
    problems: list[tuple[str, str]] = []
    stages = [s.value for s in stage_names(cfg)]
    base_ranges = set(range_problems(cfg))  # reported by `validate` itself
    overrides = stage_overrides(cfg)
    for name, override in overrides.items():
        if name not in stages:
            problems.append((f"pipeline.overrides.{name}", f"no stage named '{name}' in {stages} "
                             f"(drop it from the command line with pipeline.overrides.{name}=null)"))
            continue
        try:
            stage_cfg = apply_override(cfg, override)
        except ValueError as exc:
            problems.append((f"pipeline.overrides.{name}", str(exc)))
            continue
        where = f"pipeline.overrides.{name} -> "
        problems += [(key, where + msg) for key, msg in range_problems(stage_cfg) if (key, msg) not in base_ranges]
        problems += _checks(stage_cfg, Stage(name), prefix=where)
    for name in dict.fromkeys(stages):
        if name not in overrides:
            problems += _checks(cfg, Stage(name), prefix="")
    return problems


def stage_overrides(cfg: AjetConfig) -> dict[str, Any]:
    """`pipeline.overrides` without the stages set to null (`pipeline.overrides.sft=null` on the
    command line drops a YAML's override, e.g. when `pipeline.stages` leaves that stage out)."""
    return {name: override for name, override in cfg.pipeline.overrides.items() if override is not None}


def apply_override(cfg: AjetConfig, override: Any) -> AjetConfig:
    """`cfg` with a nested mapping merged over it (ValueError naming the bad key)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(override, dict):
        raise ValueError(f"must be a mapping of config sections, got {type(override).__name__}")
    if "pipeline" in override:
        raise ValueError("a stage cannot change the pipeline itself")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cfg), OmegaConf.create(override))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ValueError(f"{key}: {str(exc).strip().splitlines()[0]}") from None
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def _checks(cfg: AjetConfig, stage: Stage, prefix: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            out.append((key, prefix + msg))

    if stage == Stage.sft:
        s = cfg.sft
        need(bool(s.train_path), "sft.train_path", "required for the sft stage: a JSONL file of dialogs")
        for key, value in (("sft.train_path", s.train_path), ("sft.dev_path", s.dev_path)):
            if value:
                need(Path(value).is_file(), key, f"file not found: {value}")
        bad = {k: v for k, v in s.task_weights.items() if v < 0}
        need(not bad, "sft.task_weights", f"weights must be >= 0, got {bad}")
        if s.replay.ratio > 0:
            need(s.replay.buffer_size > 0, "sft.replay.buffer_size", "replay.ratio > 0 needs a buffer_size > 0")
            need(s.rounds >= 2, "sft.rounds", "replay mixes earlier rounds into later ones: set sft.rounds >= 2")
    elif stage == Stage.distill:
        d = cfg.distill
        need(bool(d.teacher), "distill.teacher", "required for distillation: a local checkpoint directory "
                                                 "(e.g. an earlier run's final_model/), a peft adapter "
                                                 "directory, or a teacher endpoint URL (http://host:8000/v1)")
        if d.teacher and "://" in d.teacher:
            need(d.teacher.startswith(("http://", "https://")), "distill.teacher",
                 f"{d.teacher!r}: an endpoint must be an http:// or https:// URL")
        if d.reward_coef > 0:
            need(cfg.rollout.n >= 2, "rollout.n", f"distill.reward_coef={d.reward_coef} mixes in the task "
                                                  "reward's group advantage, which needs rollout.n >= 2")
        need(not cfg.rollout.dynamic_sampling.enabled or d.reward_coef > 0, "rollout.dynamic_sampling.enabled",
             "drops groups whose rewards agree, but distillation learns from every episode (the teacher "
             "scores each token); set it to false, or mix in the reward with distill.reward_coef > 0")
    elif stage == Stage.dpo:
        a = cfg.algorithm
        need(cfg.rollout.n >= 2, "rollout.n", "dpo pairs the best and worst of a task's episodes: "
                                               "set rollout.n >= 2")
        if a.dpo_reference == ReferenceModel.lora_base and not a.dpo_reference_free:
            need(cfg.model.lora.enabled, "algorithm.dpo_reference",
                 "'lora_base' needs model.lora.enabled=true; use 'frozen' for full fine-tuning")
    return out
