"""Per-role metrics shown (issue 26): the progress line, the end-of-run summary, `ajet report`'s
roles figure and the validation metrics."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ajet.outputs.progress import TrainingProgress, role_rewards_text
from ajet.outputs.report import expand_keys, load_run, summarize
from ajet.outputs.summary import summarize_run
from ajet.rollout.episode import Episode
from ajet.training.validation import validation_metrics
from ajet.workflow import WorkflowOutput, WorkflowTask

STEP = {"reward/mean": 0.5, "success/rate": 0.0, "role/wolf/reward": 0.75, "role/villager/reward": 0.25,
        "role/wolf/calls": 2.0, "role/villager/calls": 3.0}


def test_the_progress_line_shows_each_roles_reward(caplog: pytest.LogCaptureFixture) -> None:
    assert role_rewards_text(STEP) == "villager 0.25, wolf 0.75"
    assert role_rewards_text({"reward/mean": 0.5}) == ""
    progress = TrainingProgress(3, 0, quiet=True)
    with caplog.at_level(logging.INFO, logger="ajet.progress"):
        progress.step_done(1, STEP)
        progress.step_done(2, {"reward/mean": 0.5})
    progress.close()
    first, second = (r.getMessage() for r in caplog.records)
    assert "reward 0.500" in first and "roles villager 0.25, wolf 0.75" in first
    assert "roles" not in second


def write_run(run: Path) -> Path:
    run.mkdir(parents=True)
    rows = [{"step": 0, "split": "val", "val/success/rate": 0.0, "val/role/wolf/reward": 0.2},
            {"step": 1, "split": "train", **STEP, "role/wolf/success": 0.5},
            {"step": 2, "split": "train", **STEP, "role/wolf/reward": 1.0, "role/wolf/success": 1.0},
            {"step": 2, "split": "val", "val/success/rate": 0.5, "val/role/wolf/reward": 0.9}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_the_end_summary_has_rows_per_role(tmp_path: Path) -> None:
    rows = {label: (before, after) for label, before, after in summarize_run(write_run(tmp_path / "run")).rows}
    assert rows["train wolf reward"] == (0.75, 1.0)
    assert rows["train wolf success"] == (0.5, 1.0)
    assert rows["train villager reward"] == (0.25, 0.25)
    assert rows["train villager LLM calls / episode"] == (3.0, 3.0)
    assert rows["val wolf reward"] == (0.2, 0.9)
    assert "train villager success" not in rows  # not logged: no row


def test_report_plots_and_tabulates_each_role(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run"))
    assert expand_keys(run.rows, ("role/*/reward", "val/role/*/reward")) == [
        "role/villager/reward", "role/wolf/reward", "val/role/wolf/reward"]
    metrics = summarize(run)["metrics"]
    assert metrics["role/wolf/reward"]["best"] == 1.0 and metrics["role/wolf/reward"]["best_step"] == 2
    assert metrics["val/role/wolf/reward"]["last"] == 0.9
    assert "role/wolf/calls" not in metrics  # plotted, not tabulated


def test_validation_reports_each_roles_metrics() -> None:
    task = WorkflowTask(task_id="t")
    episodes = [Episode(episode_id="e0", task=task, group_id="t", reward=0.5, role_rewards={"wolf": 1.0, "villager": 0.0},
                        role_calls={"wolf": 2, "villager": 1}),
                Episode(episode_id="e1", task=task, group_id="t", status="failed")]
    metrics = validation_metrics(episodes, k=2)
    assert metrics["val/role/wolf/reward"] == 1.0 and metrics["val/role/villager/success"] == 0.0
    assert metrics["val/role/wolf/calls"] == 2.0  # over the ok episodes
    assert metrics["val/reward/mean"] == 0.25  # the failed episode counts 0, as before


def test_validation_reports_the_workflows_own_metrics() -> None:
    """A game's behaviour (win, vote hits) is measured on val too, not only in training."""
    task = WorkflowTask(task_id="t")
    episodes = [Episode(episode_id=f"e{i}", task=task, group_id="t", reward=float(i),
                        output=WorkflowOutput(reward=float(i), log_metrics={"vote_hit/seer": float(i)}))
                for i in (0, 1)]
    episodes.append(Episode(episode_id="e2", task=task, group_id="t", status="failed"))
    metrics = validation_metrics(episodes, k=1)
    assert metrics["val/workflow/vote_hit/seer"] == 0.5  # over the ok episodes


def test_the_eta_never_passes_the_wall_budget(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `trainer.max_minutes` (a budget, total_steps only a cap), the eta is the budget left."""
    import ajet.outputs.progress as progress_module

    now = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    capped = TrainingProgress(100_000, 0, quiet=True, max_minutes=5)
    uncapped = TrainingProgress(100_000, 0, quiet=True)
    now[0] = 60.0  # the first step took a minute
    with caplog.at_level(logging.INFO, logger="ajet.progress"):
        capped.step_done(1, {"reward/mean": 0.5})
        uncapped.step_done(1, {"reward/mean": 0.5})
    first, second = (r.getMessage() for r in caplog.records)
    assert first.endswith("eta 240s")  # 5 min budget, 1 min spent
    assert second.endswith("eta 5999940s")  # 99,999 steps of a minute
