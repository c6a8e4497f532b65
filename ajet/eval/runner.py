"""`evaluate`: run the workflow on a split with a given model and write RUN/eval/eval_<name>.json.

The model is loaded from `model.path` (a Hugging Face checkpoint dir, the bundled model's
name, or a peft adapter dir merged into its base, e.g. one role's adapter of a per-role run:
`RUN/final_model/adapters/<role>`), so reports of different checkpoints compare: each names
its model path. Every role of the workflow then plays with that one model, except with
`model.lora.per_role`, where a per-role run's `final_model/` (the base and `adapters/<role>/`)
is served as in training: each role with its own adapter, "initial" the base.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ajet.config.schema import AjetConfig, EvalSplit
from ajet.config.validate import eval_name_problem
from ajet.errors import ConfigError, EvalError  # noqa: F401 - still importable here, where users caught it
from ajet.eval.dialogs import episode_dialogs, write_dialogs
from ajet.eval.metrics import EpisodeResult, episode_result, summarize, write_report
from ajet.models.load import (
    load_model_and_tokenizer,
    model_source,
    role_adapter_dirs,
    with_role_adapters,
)
from ajet.rollout.agent_metrics import agent_metrics
from ajet.rollout.engine_rollout import EngineRollout
from ajet.rollout.manager import mean_log_metrics
from ajet.rollout.roles import role_metrics
from ajet.rollout.workflow_loader import as_workflow, load_workflow
from ajet.task_reader import build_reader, split_tasks
from ajet.training.memory import limit_heap_retention
from ajet.training.model import model_window
from ajet.training.run_dir import run_dir_of

log = logging.getLogger(__name__)


@dataclass
class EvalReport:
    path: Path
    name: str
    model: str
    metrics: dict[str, float]
    results: list[EpisodeResult]


def default_name(model_path: str) -> str:
    """A file-name-safe label of a model path: `.../stages/01_sft/final_model` -> `01_sft-final_model`."""
    parts = [p for p in Path(model_path).parts if p not in ("/", "")][-2:]
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", "-".join(parts)) or "model"


def evaluate(cfg: AjetConfig, *, workflow: Any = None, name: str | None = None,
             out_dir: Path | None = None, dialogs: Path | None = None, successful_only: bool = False) -> EvalReport:
    """Run `eval.n` episodes of each task of `eval.split` with `model.path`; write and return the report.
    `dialogs`: also write each episode as an SFT dialog there (`ajet.eval.dialogs`; with
    `successful_only`, the successful episodes only)."""
    e = cfg.eval
    if (name or e.name) and (problem := eval_name_problem(name or e.name)):  # before the model loads
        raise ConfigError(f"eval.name (--name): {problem}")
    wf = as_workflow(workflow) if workflow is not None else load_workflow(cfg.workflow.target)
    tasks = split_tasks(build_reader(cfg.task_reader, seed=cfg.project.seed, env=cfg.env), EvalSplit(e.split))
    if e.max_tasks:
        tasks = tasks[: e.max_tasks]
    temperature = cfg.rollout.temperature if e.temperature is None else e.temperature
    rollout = dataclasses.replace(cfg.rollout, temperature=temperature)
    limit_heap_retention(cfg.trainer.malloc_mmap_threshold_kb * 1024)  # freed KV and logits go back to the OS
    model, tokenizer = load_model_and_tokenizer(cfg.model)
    checkpoint, adapter = model_source(cfg.model)
    model_path = str(adapter or checkpoint)
    # A per-role run's final_model/: each role plays its own adapter, the others their default
    # model ("initial" = the base), as in training's validation.
    roles = role_adapter_dirs(checkpoint) if adapter is None and cfg.model.lora.per_role else {}
    if roles:
        model = with_role_adapters(model, roles)
    name = name or e.name or default_name(model_path)
    local = EngineRollout.local(cfg, model, tokenizer, wf, model_max_len=model_window(model, cfg.context.max_model_len),
                                rollout=rollout, record=True, fixed_weights=True)
    start = time.monotonic()
    try:
        log.info("eval %s: %d %s tasks x %d on %s (temperature %g)", name, len(tasks), e.split.value, e.n,
                 model_path, temperature)
        result = local.rollout(tasks, e.n, episode_prefix="eval-")
        results = [episode_result(ep, local.calls(ep.episode_id)) for ep in result.episodes]
        if dialogs is not None:
            rows = [row for ep in result.episodes if ep.ok and (ep.is_success or not successful_only)
                    for row in episode_dialogs(ep.episode_id, local.calls(ep.episode_id))]
            write_dialogs(dialogs, rows)
            log.info("eval %s: %d dialogs -> %s", name, len(rows), dialogs)
    finally:
        local.close()
    metrics = summarize(results, k=e.n)
    metrics.update(agent_metrics(result.episodes))
    # A multi-agent workflow's per-role scores, the workflow's own behaviour metrics (e.g. a
    # game's win rate) and its sandbox counts, over the ok episodes, named as in training.
    ok = [ep for ep in result.episodes if ep.ok]
    metrics.update(role_metrics(ok))
    metrics.update({k: v for k, v in mean_log_metrics(ok, set()).items() if k.startswith(("workflow/", "sandbox/"))})
    metrics["time_s"] = time.monotonic() - start
    out_dir = out_dir or run_dir_of(cfg) / "eval"
    path = out_dir / f"eval_{name}.json"
    write_report(path, name=name, model=model_path, split=e.split, n=e.n, temperature=temperature,
                 metrics=metrics, results=results)
    log.info("eval %s: %s -> %s", name, "  ".join(f"{k} {v:.3f}" for k, v in metrics.items()), path)
    return EvalReport(path=path, name=name, model=model_path, metrics=metrics, results=results)


def metrics_table(reports: list[EvalReport] | list[dict[str, Any]]) -> Any:
    """A rich Table with one column per report (model), one row per metric."""
    from rich.table import Table

    rows: list[dict[str, Any]] = [r if isinstance(r, dict) else {"name": r.name, "model": r.model, "metrics": r.metrics} for r in reports]
    table = Table(title="ajet eval", show_lines=False)
    table.add_column("metric", style="bold")
    for row in rows:
        table.add_column(str(row["name"]), justify="right")
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row["metrics"] if k not in keys]
    for key in keys:
        values = [row["metrics"].get(key) for row in rows]
        table.add_row(key, *("-" if v is None else f"{v:.3f}" if isinstance(v, float) and not v.is_integer()
                             else f"{v:g}" for v in values))
    table.caption = "\n".join(f"{row['name']}: {row['model']}" for row in rows)
    table.caption_justify = "left"
    return table
