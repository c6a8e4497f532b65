"""Training report of one or more runs: PNG plots and one `report.html` from `metrics.jsonl`.

Reading and summarising are pure functions over the rows of `metrics.jsonl` (see
docs/outputs.md); only `write_report` touches matplotlib, imported there with the Agg backend
so `ajet --help` and headless machines never need a display. A metric a run did not log is
skipped with a note in the report, never a crash: a debug run has no `actor/kl`, a run without
validation has no `val/*`. The signs that a run was not learning (`ajet.outputs.learning_signs`,
the same function the training loop warns with) follow the summary table and are in
`summary.json`.
"""

from __future__ import annotations

import base64
import fnmatch
import html
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ajet.errors import RunDataError
from ajet.files import atomic_open, write_json_atomic, write_text_atomic
from ajet.outputs.learning_signs import find_learning_signs
from ajet.outputs.metrics import read_jsonl

if TYPE_CHECKING:  # matplotlib is imported where a report is drawn
    from matplotlib.axes import Axes
    from matplotlib.typing import ColorType

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Panel:
    """One subplot: the metric keys drawn on it (patterns with '*': 'rollout/failed/*', 'role/*/reward')."""

    title: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Figure:
    filename: str
    title: str
    panels: tuple[Panel, ...]


FIGURES: tuple[Figure, ...] = (
    Figure("reward.png", "Reward", (Panel("reward (train mean ± std, val mean)", ("reward/mean", "val/reward/mean")),)),
    Figure("success.png", "Success", (Panel("success rate", ("success/rate", "val/success/rate", "val/pass@k")),)),
    Figure(
        "throughput.png",
        "Throughput",
        (Panel("tokens / s", ("perf/tokens_per_s",)), Panel("step time (s)", ("perf/step_time_s",))),
    ),
    Figure(
        "context.png",
        "Context merging",
        (
            Panel("merge ratio", ("context/merge_ratio",)),
            Panel("tokens", ("context/tokens_merged", "context/tokens_packed", "context/tokens_distinct")),
            Panel("forks by cause", ("context/fork/*",)),
        ),
    ),
    Figure(
        "agent.png",
        "Agent tool use",
        (
            Panel("tool use", ("agent/tool_call_rate", "agent/valid_tool_call_rate", "agent/success_with_tool",
                               "val/agent/tool_call_rate", "val/agent/success_with_tool")),
            Panel("LLM calls per episode", ("agent/calls_per_episode", "val/agent/calls_per_episode")),
        ),
    ),
    Figure("failures.png", "Rollout failures", (Panel("failed episodes", ("rollout/failed", "rollout/failed/*")),)),
    Figure(
        "roles.png",
        "Roles (multi-agent runs)",
        (
            Panel("reward by role", ("role/*/reward", "val/role/*/reward")),
            Panel("success by role", ("role/*/success", "val/role/*/success")),
            Panel("LLM calls per episode by role", ("role/*/calls",)),
            Panel("completion tokens per episode by role", ("role/*/tokens",)),
        ),
    ),
    Figure(
        "actor.png",
        "Actor",
        (
            Panel("loss", ("actor/loss",)),
            Panel("KL", ("actor/kl",)),
            Panel("entropy", ("actor/entropy",)),
            Panel("clip fraction", ("actor/clip_frac",)),
            Panel("grad norm", ("actor/grad_norm",)),
        ),
    ),
)

# Summary table rows and which direction is "best" (+1 higher, -1 lower, 0 none); each role's
# reward and success follow in a multi-agent run (`summary_keys`).
SUMMARY_KEYS: dict[str, int] = {
    "reward/mean": 1,
    "val/reward/mean": 1,
    "success/rate": 1,
    "val/success/rate": 1,
    "val/pass@k": 1,
    "agent/tool_call_rate": 0,
    "agent/valid_tool_call_rate": 1,
    "agent/success_with_tool": 1,
    "perf/tokens_per_s": 1,
    "perf/step_time_s": -1,
    "context/merge_ratio": 1,
    "rollout/failed": -1,
    "actor/loss": -1,
    "actor/kl": 0,
    "actor/entropy": 0,
}


@dataclass
class Run:
    name: str
    path: Path
    rows: list[dict] = field(default_factory=list)


def load_run(run_dir: Path, name: str | None = None) -> Run:
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        raise RunDataError(
            f"no metrics.jsonl in {run_dir}; pass a run directory ({{project.exp_dir}}/{{project.name}})"
        )
    return Run(name or Path(run_dir).name, Path(run_dir), [_val_prefixed(r) for r in read_jsonl(metrics)])


def _val_prefixed(row: dict) -> dict:
    """A validation row's metrics under `val/`, so they never mix into the train curves."""
    if row.get("split") != "val":
        return row
    keep = ("step", "split", "time")
    return {k if k in keep or k.startswith("val/") else f"val/{k}": v for k, v in row.items()}


def run_names(paths: list[Path]) -> list[str]:
    """Short legend names: the directory name, with its parent where two runs share a name."""
    names = [Path(p).resolve().name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{Path(p).resolve().parent.name}/{Path(p).resolve().name}" for p in paths]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, sorted by step; a re-logged step (resume) keeps its last value."""
    by_step: dict[int, float] = {}
    for row in rows:
        value, step = _number(row.get(key)), row.get("step")
        if value is not None and isinstance(step, int):
            by_step[step] = value
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def expand_keys(rows: list[dict], keys: tuple[str, ...]) -> list[str]:
    """Concrete metric keys for a panel: a key with '*' matches every logged key it fits
    ('prefix/*': every key under the prefix; 'role/*/reward': each role's reward)."""
    logged = sorted({k for row in rows for k in row})
    out: list[str] = []
    for key in keys:
        if "*" in key:
            out += [k for k in logged if fnmatch.fnmatchcase(k, key) and k not in out]
        elif key in logged and key not in out:
            out.append(key)
    return out


def summary_keys(rows: list[dict]) -> dict[str, int]:
    """`SUMMARY_KEYS`, then each role's reward and success (higher is better) the rows hold."""
    roles = expand_keys(rows, ("role/*/reward", "role/*/success", "val/role/*/reward", "val/role/*/success"))
    return SUMMARY_KEYS | {key: 1 for key in roles}


def summarize(run: Run) -> dict:
    """First/last/best value (and its step) of each summary metric the run logged, and the
    signs that the run was not learning (`learning_signs`)."""
    metrics: dict[str, dict] = {}
    for key, direction in summary_keys(run.rows).items():
        steps, values = series(run.rows, key)
        if not steps:
            continue
        entry = {"first": values[0], "first_step": steps[0], "last": values[-1], "last_step": steps[-1]}
        if direction:
            i = max(range(len(values)), key=lambda j: direction * values[j])
            entry |= {"best": values[i], "best_step": steps[i]}
        metrics[key] = entry

    def split_steps(split: str) -> list[int]:
        return sorted({r["step"] for r in run.rows if isinstance(r.get("step"), int) and r.get("split", "train") == split})

    return {
        "name": run.name,
        "path": str(run.path),
        "steps": split_steps("train"),
        "val_steps": split_steps("val"),
        "metrics": metrics,
        "learning_signs": [asdict(sign) for sign in find_learning_signs(run.rows)],
    }


def _draw_panel(ax: Axes, runs: list[Run], panel: Panel, colors: list[ColorType]) -> bool:
    """Draw one panel for all runs; False when no run logged any of its keys.

    One run: one colour per metric. Several runs: one colour per run (the comparison), the
    metrics of a panel told apart by line style and marker. Validation curves are dashed.
    """
    drawn = False
    styles = ["-", ":", "-.", (0, (5, 1))]
    markers = ["o", "s", "^", "D", "v"]
    for r, run in enumerate(runs):
        for k, key in enumerate(expand_keys(run.rows, panel.keys)):
            steps, values = series(run.rows, key)
            if not steps:
                continue
            is_val = key.startswith("val/")
            color = colors[(r if len(runs) > 1 else k) % len(colors)]
            ax.plot(
                steps,
                values,
                linestyle="--" if is_val else styles[k % len(styles)] if len(runs) > 1 else "-",
                marker=markers[k % len(markers)] if is_val or len(steps) <= 30 else None,
                markersize=3.5,
                color=color,
                label=key if len(runs) == 1 else f"{run.name}: {key}",
            )
            if key == "reward/mean":
                _std_band(ax, run.rows, steps, values, color)
            drawn = True
    if drawn:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    return drawn


def _std_band(ax: Axes, rows: list[dict], steps: list[int], values: list[float], color: ColorType) -> None:
    std_steps, stds = series(rows, "reward/std")
    std = dict(zip(std_steps, stds, strict=True))
    pts = [(s, v, std[s]) for s, v in zip(steps, values, strict=True) if s in std]
    if pts:
        xs = [s for s, _, _ in pts]
        ax.fill_between(xs, [m - d for _, m, d in pts], [m + d for _, m, d in pts], color=color, alpha=0.15)


def plot_figure(fig_spec: Figure, runs: list[Run], out: Path) -> list[str]:
    """Write one PNG; returns the titles of the panels drawn (empty: nothing logged, no file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [p for p in fig_spec.panels if any(expand_keys(r.rows, p.keys) for r in runs)]
    if not present:
        return []
    colors = matplotlib.color_sequences["tab10"]  # the tab10 colormap's colours, as a list
    fig, axes = plt.subplots(1, len(present), figsize=(5.2 * len(present), 3.6), squeeze=False)
    drawn = [p.title for ax, p in zip(axes[0], present, strict=True) if _draw_panel(ax, runs, p, colors)]
    fig.suptitle(fig_spec.title if len(runs) == 1 else f"{fig_spec.title}: {' vs '.join(r.name for r in runs)}")
    fig.tight_layout()
    try:
        with atomic_open(out, "wb") as handle:  # a killed `ajet report` never leaves half a PNG
            fig.savefig(handle, format="png", dpi=110)
    finally:
        plt.close(fig)
    return drawn


def write_report(run_dirs: list[Path], out_dir: Path | None = None) -> Path:
    """Plot every figure for the runs (overlaid when several) and write `report.html`; returns it."""
    if not run_dirs:
        raise RunDataError("give at least one run directory")
    runs = [load_run(Path(d), name) for d, name in zip(run_dirs, run_names(list(run_dirs)), strict=True)]
    if out_dir is None:
        out_dir = runs[0].path / ("report" if len(runs) == 1 else "report_compare")
    out_dir.mkdir(parents=True, exist_ok=True)

    figures, notes = [], []
    for spec in FIGURES:
        for run in runs:
            missing = [p.title for p in spec.panels if not expand_keys(run.rows, p.keys)]
            if missing:
                notes.append(f"{run.name}: no {', '.join(missing)} metrics ({spec.filename})")
        png = out_dir / spec.filename
        if plot_figure(spec, runs, png):
            figures.append(spec.filename)
        else:
            png.unlink(missing_ok=True)
            logger.info("skipping %s: no run logged its metrics", spec.filename)
    summary = {"runs": [summarize(r) for r in runs], "figures": figures, "notes": notes}
    write_json_atomic(out_dir / "summary.json", summary)
    report = out_dir / "report.html"
    write_text_atomic(report, render_html(summary, out_dir))
    return report


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}"


def render_html(summary: dict, out_dir: Path) -> str:
    """One self-contained page: the summary table, then each PNG inlined as base64."""
    runs = summary["runs"]
    head = (
        '<tr><th rowspan="2">metric</th>'
        + "".join(f'<th colspan="3">{html.escape(r["name"])}</th>' for r in runs)
        + "</tr><tr>"
        + "<th>first</th><th>last</th><th>best</th>" * len(runs)
        + "</tr>"
    )
    rows = ["<tr><td>train steps</td>" + "".join(
        f'<td colspan="3">{len(r["steps"])} ({_span(r["steps"])}), val {len(r["val_steps"])}</td>' for r in runs
    ) + "</tr>"]
    for key in SUMMARY_KEYS | {k: 1 for r in runs for k in r["metrics"]}:  # the roles' keys after
        if any(key in r["metrics"] for r in runs):
            cells = "".join(_summary_cells(r["metrics"].get(key)) for r in runs)
            rows.append(f"<tr><td><code>{html.escape(key)}</code></td>{cells}</tr>")
    imgs = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((out_dir / name).read_bytes()).decode("ascii")}"><figcaption>{name}</figcaption></figure>'
        for name in summary["figures"]
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in summary["notes"])
    title = "ajet report: " + " vs ".join(r["name"] for r in runs)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:24px;color:#222}}table{{border-collapse:collapse;margin:12px 0}}
td,th{{border:1px solid #ddd;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}
th{{background:#f4f5f7}}small{{color:#888}}figure{{display:inline-block;vertical-align:top;margin:12px 12px 12px 0}}img{{max-width:100%;border:1px solid #eee}}
.notes{{color:#777;font-size:12px}}</style></head><body>
<h1>{html.escape(title)}</h1>
<table id="summary">{head}{"".join(rows)}</table>
{_signs_html(runs)}
{imgs}
<details class="notes"><summary>{len(summary["notes"])} notes (metrics not logged)</summary><ul>{notes}</ul></details>
</body></html>
"""


def _signs_html(runs: list[dict]) -> str:
    """The signs each run was not learning, with their evidence and lever; a line when none."""
    rows = [
        f"<tr><td>{html.escape(r['name'])}</td><td><code>{html.escape(s['name'])}</code></td>"
        f"<td>{s['step']}–{s['last_step']}</td>{_left(s['evidence'])}{_left(s['lever'])}</tr>"
        for r in runs for s in r["learning_signs"]
    ]
    if not rows:
        return '<p id="learning-signs">No sign that a run was not learning.</p>'
    return ('<h2>Signs that the run was not learning</h2><table id="learning-signs"><tr><th>run</th>'
            "<th>sign</th><th>steps</th><th>evidence</th><th>try</th></tr>" + "".join(rows) + "</table>")


def _left(text: str) -> str:
    return f'<td style="text-align:left">{html.escape(text)}</td>'


def _summary_cells(m: dict | None) -> str:
    if m is None:
        return "<td>—</td>" * 3
    best = f"{_fmt(m['best'])} <small>@{m['best_step']}</small>" if "best" in m else "—"
    return (
        f"<td>{_fmt(m['first'])} <small>@{m['first_step']}</small></td>"
        f"<td>{_fmt(m['last'])} <small>@{m['last_step']}</small></td><td>{best}</td>"
    )


def _span(steps: list[int]) -> str:
    return f"{steps[0]}–{steps[-1]}" if steps else "—"
