"""Staged agent training: `pipeline.stages: [sft, dpo, grpo, eval]` in one YAML.

Each stage runs with the run's config plus `pipeline.overrides[<stage>]`, starting from
the model the previous training stage produced (`RUN/stages/NN_<stage>/final_model`).
Training stages write their own run directory under `RUN/stages/`; eval stages write
`RUN/eval/eval_NN_<model label>.json`; `RUN/pipeline.json` lists what each stage did.
With `--resume`, stages whose outputs exist are skipped and the first unfinished one resumes.

The checks at the top (`stage_problems`, `needs_workflow`) run at config load and import
nothing heavy.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ajet.config.schema import AjetConfig, Algorithm

log = logging.getLogger(__name__)

RL_STAGES = ("grpo", "rloo", "reinforce_pp", "ppo")
STAGES = ("sft", "dpo", *RL_STAGES, "eval")
EVAL_SPLITS = ("val", "train")
DPO_REFERENCES = ("frozen", "lora_base")


def stage_names(cfg: AjetConfig) -> list[str]:
    """The stages a run executes: `pipeline.stages`, or the one `algorithm.name`."""
    return list(cfg.pipeline.stages) or [cfg.algorithm.name.value]


def needs_workflow(cfg: AjetConfig) -> bool:
    """Every stage but SFT runs the workflow (rollouts or evaluation)."""
    return any(stage != "sft" for stage in stage_names(cfg))


def stage_problems(cfg: AjetConfig) -> list[tuple[str, str]]:
    """Config problems of the stages the run executes, as (dotted key, what would be valid)."""
    problems: list[tuple[str, str]] = []
    stages = stage_names(cfg)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        return [("pipeline.stages", f"unknown stage(s) {unknown}; use {list(STAGES)}")]
    for name, override in cfg.pipeline.overrides.items():
        if name not in stages:
            problems.append((f"pipeline.overrides.{name}", f"no stage named '{name}' in {stages}"))
            continue
        try:
            stage_cfg = apply_override(cfg, override)
        except ValueError as exc:
            problems.append((f"pipeline.overrides.{name}", str(exc)))
            continue
        problems += _checks(stage_cfg, name, prefix=f"pipeline.overrides.{name} -> ")
    for name in dict.fromkeys(stages):
        if name not in cfg.pipeline.overrides:
            problems += _checks(cfg, name, prefix="")
    return problems


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


def _checks(cfg: AjetConfig, stage: str, prefix: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            out.append((key, prefix + msg))

    if stage == "sft":
        s = cfg.sft
        need(bool(s.train_path), "sft.train_path", "required for the sft stage: a JSONL file of dialogs")
        for key, value in (("sft.train_path", s.train_path), ("sft.dev_path", s.dev_path)):
            if value:
                need(Path(value).is_file(), key, f"file not found: {value}")
        need(s.epochs >= 1, "sft.epochs", "must be >= 1")
        need(s.batch_size >= 1, "sft.batch_size", "must be >= 1")
        need(s.lr > 0, "sft.lr", "must be > 0")
        need(s.rounds >= 1, "sft.rounds", "must be >= 1")
        need(0 <= s.dev_fraction < 1, "sft.dev_fraction", "must be in [0, 1)")
        need(s.eval_every >= 0, "sft.eval_every", "must be >= 0 (0 = after every epoch)")
        bad = {k: v for k, v in s.task_weights.items() if v < 0}
        need(not bad, "sft.task_weights", f"weights must be >= 0, got {bad}")
        need(s.coreset.size >= 0, "sft.coreset.size", "must be >= 0 (0 = all dialogs)")
        need(s.coreset.ngram >= 1, "sft.coreset.ngram", "must be >= 1")
        need(0 <= s.coreset.hybrid_alpha <= 1, "sft.coreset.hybrid_alpha", "must be in [0, 1]")
        need(s.replay.buffer_size >= 0, "sft.replay.buffer_size", "must be >= 0 (0 = no replay)")
        need(0 <= s.replay.ratio < 1, "sft.replay.ratio", "must be in [0, 1)")
        if s.replay.ratio > 0:
            need(s.replay.buffer_size > 0, "sft.replay.buffer_size", "replay.ratio > 0 needs a buffer_size > 0")
            need(s.rounds >= 2, "sft.rounds", "replay mixes earlier rounds into later ones: set sft.rounds >= 2")
    elif stage == "dpo":
        a = cfg.algorithm
        need(cfg.rollout.n >= 2, "rollout.n", "dpo pairs the best and worst of a task's episodes: "
                                               "set rollout.n >= 2")
        need(a.dpo_beta > 0, "algorithm.dpo_beta", "must be > 0")
        need(0 <= a.dpo_label_smoothing <= 0.5, "algorithm.dpo_label_smoothing", "must be in [0, 0.5]")
        need(a.dpo_reference in DPO_REFERENCES, "algorithm.dpo_reference", f"one of {DPO_REFERENCES}")
        if a.dpo_reference == "lora_base" and not a.dpo_reference_free:
            need(cfg.model.lora.enabled, "algorithm.dpo_reference",
                 "'lora_base' needs model.lora.enabled=true; use 'frozen' for full fine-tuning")
    elif stage == "eval":
        e = cfg.eval
        need(e.split in EVAL_SPLITS, "eval.split", f"one of {EVAL_SPLITS}")
        need(e.n >= 1, "eval.n", "must be >= 1")
        need(e.max_tasks >= 0, "eval.max_tasks", "must be >= 0 (0 = all)")
        need(e.temperature is None or e.temperature >= 0, "eval.temperature", "must be >= 0 or null")
    return out


# ---------------------------------------------------------------------- running


def single_stage_config(cfg: AjetConfig, stage: str, *, where: str = "") -> AjetConfig:
    """`cfg` as one stage runs it: its `pipeline.overrides` merged in, its algorithm set, validated."""
    import dataclasses

    from ajet.config import ConfigError
    from ajet.config.schema import PipelineConfig
    from ajet.config.validate import validate

    if stage not in STAGES:
        raise ConfigError(f"{where}unknown stage '{stage}'; use one of {list(STAGES)}")
    try:
        stage_cfg = apply_override(cfg, cfg.pipeline.overrides.get(stage, {}))
    except ValueError as exc:
        raise ConfigError(f"{where}pipeline.overrides.{stage}: {exc}") from None
    stage_cfg.pipeline = PipelineConfig(stages=[stage])
    if stage != "eval":
        stage_cfg.algorithm = dataclasses.replace(stage_cfg.algorithm, name=Algorithm(stage))
    problems = validate(stage_cfg)
    if problems:
        lines = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        raise ConfigError(f"{where}invalid config for the {stage} stage:\n{lines}")
    return stage_cfg


def stage_config(cfg: AjetConfig, stage: str, index: int, model_path: str) -> AjetConfig:
    """The config of pipeline stage `index`: its own run dir, starting from `model_path`."""
    import dataclasses

    stage_cfg = single_stage_config(cfg, stage, where=f"pipeline stage {index} ({stage}): ")
    stage_cfg.project = dataclasses.replace(stage_cfg.project, name=f"{cfg.project.name}/stages/{index:02d}_{stage}")
    stage_cfg.model = dataclasses.replace(stage_cfg.model, path=model_path)
    stage_cfg.trainer = dataclasses.replace(stage_cfg.trainer, save_final_model=True)
    return stage_cfg


def run_stage(cfg: AjetConfig, stage: str, *, workflow: Any = None, resume: bool = False) -> Path:
    """Run one training stage; return its run directory (the model is in RUN/final_model)."""
    if stage == "sft":
        from ajet.sft.trainer import train_sft

        return train_sft(cfg, resume=resume)
    if stage == "dpo":
        from ajet.dpo.trainer import train_dpo

        return train_dpo(cfg, resume=resume, workflow=workflow)
    from ajet.backbones.debug.trainer import train

    return train(cfg, resume=resume, workflow=workflow)


def run_pipeline(cfg: AjetConfig, *, workflow: Any = None, resume: bool = False) -> Path:
    """Run every stage in order; return the pipeline's run directory."""
    from ajet.eval.runner import evaluate

    run_dir = Path(cfg.project.exp_dir) / cfg.project.name
    run_dir.mkdir(parents=True, exist_ok=True)
    model_path, label = cfg.model.path, "base"
    done: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    for index, stage in enumerate(cfg.pipeline.stages, start=1):
        stage_cfg = stage_config(cfg, stage, index, model_path)
        if stage == "eval":
            name = f"{index:02d}_{label}"
            out = run_dir / "eval" / f"eval_{name}.json"
            if not (resume and out.is_file()):
                evaluate(stage_cfg, workflow=workflow, name=name, out_dir=run_dir / "eval")
            done.append({"stage": stage, "index": index, "model": model_path, "eval": str(out)})
            reports.append(json.loads(out.read_text()))
            continue
        stage_dir = Path(stage_cfg.project.exp_dir) / stage_cfg.project.name
        final = stage_dir / "final_model"
        if resume and (final / "config.json").is_file():
            log.info("pipeline: stage %d (%s) already done: %s", index, stage, final)
        else:
            log.info("pipeline: stage %d/%d (%s) from %s", index, len(cfg.pipeline.stages), stage, model_path)
            run_stage(stage_cfg, stage, workflow=workflow, resume=resume and stage_dir.is_dir())
        model_path, label = str(final), stage
        done.append({"stage": stage, "index": index, "run_dir": str(stage_dir), "model": model_path})
        (run_dir / "pipeline.json").write_text(json.dumps({"stages": done}, indent=2))
    (run_dir / "pipeline.json").write_text(json.dumps({"stages": done, "final_model": model_path}, indent=2))
    if reports:
        log.info("pipeline evaluations (%s):\n%s", run_dir / "eval", _table_text(reports))
    return run_dir


def _table_text(reports: list[dict[str, Any]]) -> str:
    """The eval stages side by side, as text for the log."""
    import io

    from rich.console import Console

    from ajet.eval.runner import metrics_table

    buffer = io.StringIO()
    Console(file=buffer, width=120, color_system=None).print(metrics_table(reports))
    return buffer.getvalue()
