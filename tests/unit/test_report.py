"""`ajet report`: PNG plots, summary and HTML from metrics.jsonl; missing metrics are notes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.cli.report import app
from ajet.outputs.report import FIGURES, Panel, load_run, series

runner = CliRunner()
ALL_PNGS = {f.filename for f in FIGURES}


def make_metrics(run: Path, steps: int = 5, scale: float = 1.0, full: bool = True) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in range(1, steps + 1):
        row = {"step": s, "split": "train", "time": 1000.0 + s, "reward/mean": scale * s / steps, "reward/std": 0.1}
        if full:
            row |= {"reward/std": 0.1, "success/rate": 0.1 * s, "perf/tokens_per_s": 100.0 + s,
                    "perf/step_time_s": 3.0, "context/merge_ratio": 2.0 + 0.1 * s, "context/tokens_merged": 500,
                    "rollout/failed": 5 - s, "rollout/failed/timeout": 1, "actor/loss": 1.0 / s,
                    "actor/kl": 0.01 * s, "actor/entropy": 1.5, "agent/tool_call_rate": 0.2 * s,
                    "agent/calls_per_episode": 1.0 + 0.1 * s,
                    # a multi-agent run: each role's metrics (ajet.rollout.roles)
                    "role/wolf/reward": 1.0 - 0.1 * s, "role/villager/reward": 0.1 * s, "role/wolf/success": 0.5,
                    "role/wolf/calls": 2.0, "role/wolf/tokens": 30.0}
        rows.append(row)
        if full and s % 2 == 0:
            rows.append({"step": s, "split": "val", "time": 1000.5 + s, "val/reward/mean": 0.2 * s, "val/success/rate": 0.5,
                         "val/role/wolf/reward": 0.3})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return run


def assert_png(path: Path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.width > 200 and img.height > 100


def test_report_writes_every_figure_summary_and_html(tmp_path: Path):
    run = make_metrics(tmp_path / "run_a")
    result = runner.invoke(app, [str(run)])
    assert result.exit_code == 0, result.output
    out = run / "report"
    assert {p.name for p in out.glob("*.png")} == ALL_PNGS
    for png in out.glob("*.png"):
        assert_png(png)

    summary = json.loads((out / "summary.json").read_text())
    (r,) = summary["runs"]
    assert r["steps"] == [1, 2, 3, 4, 5] and r["val_steps"] == [2, 4]
    reward = r["metrics"]["reward/mean"]
    assert (reward["first"], reward["last"], reward["best_step"]) == (0.2, 1.0, 5)
    assert r["metrics"]["rollout/failed"]["best"] == 0 and r["metrics"]["rollout/failed"]["best_step"] == 5
    assert r["metrics"]["val/reward/mean"]["last"] == pytest.approx(0.8)
    assert "best" not in r["metrics"]["actor/kl"]  # no "better" direction for KL
    villager = r["metrics"]["role/villager/reward"]  # each role's reward, best = highest
    assert (villager["first"], villager["best"], villager["best_step"]) == (0.1, 0.5, 5)
    assert r["metrics"]["role/wolf/reward"]["best_step"] == 1 and "val/role/wolf/reward" in r["metrics"]

    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(ALL_PNGS)
    assert "<code>reward/mean</code>" in page and "5 (1–5), val 2" in page
    assert "<code>role/wolf/reward</code>" in page and "<code>role/villager/reward</code>" in page


def test_missing_metrics_are_skipped_with_a_note(tmp_path: Path):
    run = make_metrics(tmp_path / "minimal", full=False)
    (run / "metrics.jsonl").open("a").write('{"step": 6, "split": "tra')  # a live run mid-write
    result = runner.invoke(app, [str(run), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "rep").glob("*.png")} == {"reward.png"}
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["figures"] == ["reward.png"]
    assert summary["runs"][0]["steps"] == [1, 2, 3, 4, 5]
    assert any("actor.png" in n for n in summary["notes"])


def test_two_runs_are_overlaid_one_colour_per_run(tmp_path: Path):
    a = make_metrics(tmp_path / "a" / "exp1")
    b = make_metrics(tmp_path / "b" / "exp2", steps=3, scale=0.5)
    result = runner.invoke(app, [str(a), str(b)])
    assert result.exit_code == 0, result.output
    out = a / "report_compare"
    assert {p.name for p in out.glob("*.png")} == ALL_PNGS
    summary = json.loads((out / "summary.json").read_text())
    assert [r["name"] for r in summary["runs"]] == ["exp1", "exp2"]
    assert [r["steps"] for r in summary["runs"]] == [[1, 2, 3, 4, 5], [1, 2, 3]]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ajet.outputs.report import _draw_panel

    fig, ax = plt.subplots()
    runs = [load_run(a, "exp1"), load_run(b, "exp2")]
    assert _draw_panel(ax, runs, Panel("r", ("reward/mean",)), ["red", "blue"])
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines] == ["exp1: reward/mean", "exp2: reward/mean"]
    assert [ln.get_color() for ln in lines] == ["red", "blue"]
    assert list(lines[1].get_xdata()) == [1, 2, 3]
    plt.close(fig)


def test_series_keeps_last_value_of_a_relogged_step_and_prefixes_val_rows(tmp_path: Path):
    run = tmp_path / "r"
    run.mkdir()
    rows = [{"step": 1, "split": "train", "reward/mean": 0.1}, {"step": 2, "split": "train", "reward/mean": 0.2},
            {"step": 2, "split": "train", "reward/mean": 0.25},  # resumed run re-logs step 2
            {"step": 2, "split": "val", "reward/mean": 0.9},  # unprefixed val metric stays out of train
            {"step": 3, "split": "train", "reward/mean": float("nan")}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    loaded = load_run(run)
    assert series(loaded.rows, "reward/mean") == ([1, 2], [0.1, 0.25])
    assert series(loaded.rows, "val/reward/mean") == ([2], [0.9])
    assert not math.isnan(sum(series(loaded.rows, "reward/mean")[1]))


def test_report_without_metrics_is_a_user_error(tmp_path: Path):
    result = runner.invoke(app, [str(tmp_path)])
    assert result.exit_code == 2
    assert "no metrics.jsonl" in result.output and "Traceback" not in result.output
