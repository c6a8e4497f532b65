"""Staged agent training: `pipeline.stages: [sft, dpo, grpo, eval]` in one YAML.

Each stage runs with the run's config plus `pipeline.overrides[<stage>]`, starting from
the model the previous training stage produced (`RUN/stages/NN_<stage>/final_model`).
Training stages write their own run directory under `RUN/stages/`; eval stages write
`RUN/eval/eval_NN_<model label>.json`; `RUN/pipeline.json` lists what each stage did.
With `--resume`, stages whose outputs exist are skipped and the first unfinished one resumes.

`run` is what `ajet train` and `ajet.tune` call: a staged config on a backbone that runs
stages (`Capabilities.stages`: the debug backbone) runs here, stage by stage, each stage through
the backbone's own `run`; anything else is the backbone's `run` directly. The stage checks that
run at config load are in `ajet.config.stages`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ajet.algorithms.registry import EVAL_STAGE, get_algorithm
from ajet.backbones.contract import Backbone, ray_problem
from ajet.config.schema import AjetConfig
from ajet.config.validate import single_stage_config
from ajet.errors import UserError
from ajet.eval.runner import evaluate, metrics_table
from ajet.files import write_json_atomic
from ajet.rollout.workflow_loader import WorkflowArg
from ajet.sandbox.shared import configure
from ajet.training.memory import release_memory
from ajet.training.run_dir import refuse_earlier_pipeline_run, run_dir_of

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- running


def stage_config(cfg: AjetConfig, stage: str, index: int, model_path: str) -> AjetConfig:
    """The config of pipeline stage `index`: its own run dir, starting from `model_path`."""
    import dataclasses

    stage_cfg = single_stage_config(cfg, stage, where=f"pipeline stage {index} ({stage}): ")
    stage_cfg.project = dataclasses.replace(stage_cfg.project, name=f"{cfg.project.name}/stages/{index:02d}_{stage}")
    # "initial" (a frozen default model) stays the model the pipeline started from, not this
    # stage's start: after an SFT stage that would be the warmed-up policy.
    initial = cfg.model.initial_path or (cfg.model.path if model_path != cfg.model.path else "")
    stage_cfg.model = dataclasses.replace(stage_cfg.model, path=model_path, initial_path=initial)
    stage_cfg.trainer = dataclasses.replace(stage_cfg.trainer, save_final_model=True)
    return stage_cfg


def run(cfg: AjetConfig, runner: Backbone, *, backbone: str, with_ray: bool = False, resume: bool = False,
        workflow: WorkflowArg | None = None) -> None:
    """Train `cfg` on a backbone (`runner`: its module from `ajet.backbones.registry`)."""
    if cfg.sandbox.enabled:  # before anything runs model code: a sandbox, or the error with the fix
        if cfg.sandbox.backend.value == "ray" and not with_ray:
            raise UserError("sandbox.backend=ray runs the sandboxes in Ray actors: run with --with-ray "
                            "(or --with-ray-cluster ADDRESS), or set sandbox.backend=bwrap")
        log.info(configure(cfg.sandbox))
    if with_ray and (problem := ray_problem(backbone, runner.CAPABILITIES, get_algorithm(cfg.algorithm.name).recipe,
                                            staged=bool(cfg.pipeline.stages))):
        raise UserError(problem)
    if cfg.pipeline.stages:
        if not runner.CAPABILITIES.stages:  # checked_backbone refuses it first
            raise UserError(f"--backbone={backbone} does not run pipeline.stages")
        run_pipeline(cfg, runner, workflow=workflow, resume=resume)
        return
    runner.run(cfg, with_ray=with_ray, resume=resume, workflow=workflow)


def run_pipeline(cfg: AjetConfig, runner: Backbone, *, workflow: WorkflowArg | None = None,
                 resume: bool = False) -> Path:
    """Run every stage in order; return the pipeline's run directory."""
    run_dir = run_dir_of(cfg)
    refuse_earlier_pipeline_run(run_dir, resume=resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    # Seconds each stage ran, shown by the summary; a stage that a resume skips keeps its earlier figure.
    earlier = _earlier_seconds(run_dir) if resume else {}
    model_path, label = cfg.model.path, "base"
    done: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    for index, stage in enumerate(cfg.pipeline.stages, start=1):
        stage_cfg = stage_config(cfg, stage, index, model_path)
        release_memory()  # the previous stage's model and optimizer state are garbage now
        start, seconds = time.monotonic(), earlier.get(index)
        if stage == EVAL_STAGE:
            name = f"{index:02d}_{label}"
            out = run_dir / "eval" / f"eval_{name}.json"
            if not (resume and out.is_file()):
                evaluate(stage_cfg, workflow=workflow, name=name, out_dir=run_dir / "eval")
                seconds = time.monotonic() - start
            done.append({"stage": stage, "index": index, "model": model_path, "eval": str(out), **_seconds(seconds)})
            reports.append(json.loads(out.read_text()))
            continue
        stage_dir = run_dir_of(stage_cfg)
        final = stage_dir / "final_model"
        if resume and (final / "config.json").is_file():
            log.info("pipeline: stage %d (%s) already done: %s", index, stage, final)
        else:
            log.info("pipeline: stage %d/%d (%s) from %s", index, len(cfg.pipeline.stages), stage, model_path)
            runner.run(stage_cfg, with_ray=False, resume=resume and stage_dir.is_dir(), workflow=workflow)
            seconds = time.monotonic() - start
        model_path, label = str(final), stage
        done.append({"stage": stage, "index": index, "run_dir": str(stage_dir), "model": model_path,
                     **_seconds(seconds)})
        write_json_atomic(run_dir / "pipeline.json", {"stages": done})  # a kill never leaves half of it
    write_json_atomic(run_dir / "pipeline.json", {"stages": done, "final_model": model_path})
    if reports:
        log.info("pipeline evaluations (%s):\n%s", run_dir / "eval", _table_text(reports))
    return run_dir


def _earlier_seconds(run_dir: Path) -> dict[int, float]:
    """Stage index -> seconds, from the pipeline.json of an earlier (interrupted) run, if any."""
    try:
        stages = json.loads((run_dir / "pipeline.json").read_text(encoding="utf-8")).get("stages", [])
        return {int(s["index"]): float(s["seconds"]) for s in stages if "seconds" in s}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}  # no earlier record (or a damaged one): the resumed stages count from now


def _seconds(seconds: float | None) -> dict[str, float]:
    return {} if seconds is None else {"seconds": round(seconds, 1)}


def _table_text(reports: list[dict[str, Any]]) -> str:
    """The eval stages side by side, as text for the log."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=120, color_system=None).print(metrics_table(reports))
    return buffer.getvalue()
