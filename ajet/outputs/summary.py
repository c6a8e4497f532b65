"""The end-of-run summary: val success before -> after (a pipeline's: its eval stages' split,
e.g. test), the agent metrics, each role's reward, success and calls in a multi-agent run, the
wall time (a pipeline's: and each stage's), and the exact commands that open the token viewer
and the report on this run.

`summarize_run(run_dir)` reads what the run left on disk (pure, no model); `render_summary`
prints it with rich. Two kinds of run directory:

- a single training run: `metrics.jsonl`; *before* is its first validation (step 0, the
  starting model), *after* its last; the train rows give the agent metrics of the first and
  last step;
- a pipeline (`pipeline.json`): *before* is the first eval stage's report, *after* the last
  one; the agent metrics come from the same reports, and the commands point at the last
  training stage that wrote token records.

Both list the signs that training was not learning (`ajet.outputs.learning_signs`, recomputed
from each metrics.jsonl, so they match the run's warnings).

`ajet summary RUN_DIR` prints it for any finished run; the trainer prints it at the end.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ajet.outputs.learning_signs import LearningSign, find_learning_signs
from ajet.outputs.metrics import read_metrics
from ajet.outputs.progress import role_names
from ajet.outputs.report import RunDataError

# (label, key in an eval report / a val row without its "val/" prefix)
VAL_ROWS = (
    ("val success", "success/rate"),
    ("val tool-call rate", "agent/tool_call_rate"),
    ("val valid tool calls", "agent/valid_tool_call_rate"),
    ("val LLM calls / episode", "agent/calls_per_episode"),
    ("val successes using the tool", "agent/success_with_tool"),
)
TRAIN_ROWS = (
    ("train success", "success/rate"),
    ("train tool-call rate", "agent/tool_call_rate"),
    ("train valid tool calls", "agent/valid_tool_call_rate"),
    ("train LLM calls / episode", "agent/calls_per_episode"),
    ("train successes using the tool", "agent/success_with_tool"),
)
# Per role, in a multi-agent run (`role/<name>/...`, `ajet.rollout.roles`): label, metric.
ROLE_ROWS = (("reward", "reward"), ("success", "success"), ("LLM calls / episode", "calls"))


@dataclass
class RunSummary:
    run_dir: Path
    # (label, before, after); None where the run did not measure it
    rows: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    before_label: str = "before"
    after_label: str = "after"
    wall_s: float | None = None
    # A pipeline's stages and the seconds each ran ("02 sft", 97.0), from pipeline.json.
    stage_seconds: list[tuple[str, float]] = field(default_factory=list)
    view_dir: Path | None = None  # the run dir holding token records (None: none were written)
    report_dirs: list[Path] = field(default_factory=list)  # run dirs holding metrics.jsonl
    # Signs that training was not learning (`ajet.outputs.learning_signs`), recomputed from each
    # metrics.jsonl: (the stage's dir name in a pipeline, "" for a single run, sign).
    signs: list[tuple[str, LearningSign]] = field(default_factory=list)

    def commands(self) -> list[str]:
        out = []
        if self.view_dir is not None:
            out.append(f"ajet view {shlex.quote(str(self.view_dir))} --serve")
        if self.report_dirs:
            out.append("ajet report " + " ".join(shlex.quote(str(d)) for d in self.report_dirs))
        return out


def summarize_run(run_dir: Path, *, wall_s: float | None = None) -> RunSummary:
    """The summary of a finished run (a training run dir or a pipeline dir)."""
    run_dir = Path(run_dir)
    if (run_dir / "pipeline.json").is_file():
        summary = _pipeline_summary(run_dir)
    elif (run_dir / "metrics.jsonl").is_file():
        summary = _training_summary(run_dir)
    else:
        raise RunDataError(f"{run_dir} has neither metrics.jsonl nor pipeline.json; pass a run directory")
    if wall_s is not None:
        summary.wall_s = wall_s
    elif summary.wall_s is None:
        summary.wall_s = _wall_from_files(run_dir)
    return summary


def _training_summary(run_dir: Path) -> RunSummary:
    rows = read_metrics(run_dir / "metrics.jsonl")
    val = [r for r in rows if r.get("split") == "val"]
    train = [r for r in rows if r.get("split", "train") == "train"]
    summary = RunSummary(run_dir=run_dir, report_dirs=[run_dir], view_dir=_records_dir([run_dir]),
                         signs=[("", sign) for sign in find_learning_signs(rows)])
    times = [r["time"] for r in rows if isinstance(r.get("time"), (int, float))]
    if len(times) > 1:
        summary.wall_s = max(times) - min(times)  # first to last record (set-up not included)
    if val:
        first, last = val[0], val[-1]
        summary.before_label, summary.after_label = f"step {first['step']}", f"step {last['step']}"
        summary.rows += [(label, first.get(f"val/{key}"), last.get(f"val/{key}")) for label, key in VAL_ROWS]
        summary.rows += _role_rows("val", first, last, "val/")
    if train:
        first, last = train[0], train[-1]
        if not val:
            summary.before_label, summary.after_label = f"step {first['step']}", f"step {last['step']}"
        summary.rows += [(label, first.get(key), last.get(key)) for label, key in TRAIN_ROWS]
        summary.rows += _role_rows("train", first, last, "")
    summary.rows = [row for row in summary.rows if row[1] is not None or row[2] is not None]
    return summary


def _role_rows(split: str, first: dict[str, Any], last: dict[str, Any], prefix: str
               ) -> list[tuple[str, float | None, float | None]]:
    """`<split> <role> reward` etc. for each role either row reports (multi-agent runs)."""
    roles = sorted(set(role_names(first, prefix)) | set(role_names(last, prefix)))
    return [(f"{split} {role} {label}", first.get(f"{prefix}role/{role}/{key}"), last.get(f"{prefix}role/{role}/{key}"))
            for role in roles for label, key in ROLE_ROWS]


def _pipeline_summary(run_dir: Path) -> RunSummary:
    stages = _read_json(run_dir / "pipeline.json").get("stages", [])
    evals = [s for s in stages if s.get("eval")]
    trained = [Path(s["run_dir"]) for s in stages if s.get("run_dir")]
    with_metrics = [d for d in trained if (d / "metrics.jsonl").is_file()]
    summary = RunSummary(run_dir=run_dir, report_dirs=with_metrics, view_dir=_records_dir(trained),
                         stage_seconds=[(f"{s['index']:02d} {s.get('stage')}", float(s["seconds"])) for s in stages
                                        if type(s.get("index")) is int and type(s.get("seconds")) in (int, float)])
    for stage_dir in with_metrics:
        signs = find_learning_signs(read_metrics(stage_dir / "metrics.jsonl"))
        summary.signs += [(stage_dir.name, sign) for sign in signs]
    if evals:
        first, last = _read_json(Path(evals[0]["eval"])), _read_json(Path(evals[-1]["eval"]))
        summary.before_label, summary.after_label = str(first.get("name")), str(last.get("name"))
        split = str(last.get("split") or "val")  # the eval stages' split: "test success" on eval.split=test
        summary.rows = [
            (f"{split} {label.removeprefix('val ')}", first["metrics"].get(key), last["metrics"].get(key))
            for label, key in VAL_ROWS
            if key in first["metrics"] or key in last["metrics"]
        ]
    return summary


def _records_dir(run_dirs: list[Path]) -> Path | None:
    """The last of the run dirs with token records (what `ajet view` shows)."""
    for run_dir in reversed(run_dirs):
        if any((run_dir / "records").glob("step_*.jsonl")):
            return run_dir
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDataError(f"cannot read {path}: {exc}") from None


def _wall_from_files(run_dir: Path) -> float | None:
    """Seconds from the first file the run wrote to the last (when the trainer did not say)."""
    times = [p.stat().st_mtime for p in run_dir.rglob("*") if p.is_file()]
    return max(times) - min(times) if len(times) > 1 else None


def render_summary(summary: RunSummary, console: Any = None) -> None:
    """Print the table, the wall time and the commands (rich; to stdout unless `console`)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"run summary: {summary.run_dir}", title_justify="left")
    table.add_column("metric")
    table.add_column(summary.before_label, justify="right")
    table.add_column(summary.after_label, justify="right")
    table.add_column("change", justify="right")
    for label, before, after in summary.rows:
        change = f"{after - before:+.3f}" if before is not None and after is not None else ""
        table.add_row(label, _fmt(before), _fmt(after), change)
    console.print(table)
    if summary.signs:
        console.print("signs that the run was not learning:")
        for label, sign in summary.signs:
            console.print(f"  {f'[{label}] ' if label else ''}{sign.describe()}", markup=False, highlight=False)
    if summary.wall_s is not None:
        console.print(f"wall time: {summary.wall_s / 60:.1f} min ({summary.wall_s:.0f} s)")
    if summary.stage_seconds:
        console.print("stages: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in summary.stage_seconds),
                      markup=False, highlight=False)
    commands = summary.commands()
    if summary.view_dir is None:
        console.print("no token records were written (logging.token_records=false, or no step had a "
                      "trainable sample): nothing to view")
    for command in commands:
        console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"
