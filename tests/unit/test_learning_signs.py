"""Signs that a run is not learning: each from hand-made step metrics (and the step it first
holds), a healthy run with none, one warning per sign from the online monitor and the training
loop, the progress line, and the same signs in `ajet summary` and `ajet report`."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.cli.summary import app as summary_app
from ajet.config.schema import AjetConfig
from ajet.context.types import LLMCall
from ajet.outputs.learning_signs import LearningSignsMonitor, find_learning_signs
from ajet.outputs.progress import TrainingProgress
from ajet.outputs.report import write_report
from ajet.outputs.summary import summarize_run
from ajet.rollout.episode import TIMEOUT, Episode
from ajet.rollout.manager import RolloutResult
from ajet.rollout.scoring import collect_tracker
from ajet.training.loop import TrainingLoop
from ajet.training.recipe import Closers
from ajet.workflow import WorkflowTask


def healthy(step: int, **overrides: float | None) -> dict:
    """A step of a run that learns: rewards differ within groups and rise, tools are called
    and mostly valid, the entropy and KL move slowly; `None` drops a key."""
    row = {
        "step": step, "split": "train",
        "reward/mean": 0.1 + 0.05 * step, "reward/zero_std_frac": 0.25, "success/rate": 0.1 + 0.05 * step,
        "actor/clip_frac": 0.02, "actor/entropy": 1.2 - 0.02 * step, "actor/kl": 0.001 * step,
        "agent/tool_offer_rate": 1.0, "agent/tool_call_rate": 0.8, "agent/valid_tool_call_rate": 0.7,
        "rollout/truncated_rate": 0.1,
    }
    row.update(overrides)
    return {k: v for k, v in row.items() if v is not None}


def run_of(steps: int, change: dict[int, dict]) -> list[dict]:
    return [healthy(s, **change.get(s, {})) for s in range(1, steps + 1)]


def test_a_healthy_run_shows_no_sign() -> None:
    rows = run_of(12, {})
    rows.append({"step": 3, "split": "val", "val/success/rate": 0.0, "reward/zero_std_frac": 1.0})
    assert find_learning_signs(rows) == []


# (sign, steps, per-step overrides, first step it holds, last step it holds)
CASES = [
    ("no_reward_variance", 6,
     {s: {"reward/zero_std_frac": 1.0, "reward/mean": 0.0, "success/rate": 0.0} for s in range(2, 7)}, 4, 6),
    ("clip_saturated", 6, {s: {"actor/clip_frac": 0.9} for s in range(3, 7)}, 5, 6),
    ("no_tool_calls", 4,
     {s: {"agent/tool_call_rate": 0.0, "agent/valid_tool_call_rate": None} for s in range(1, 4)}, 3, 3),
    ("no_valid_answers", 5,
     {s: {"agent/valid_tool_call_rate": 0.04, "success/rate": 0.0} for s in range(1, 6)}, 3, 5),
    # The first entropy is 1.18: a tenth of it is 0.118.
    ("entropy_collapse", 5, {4: {"actor/entropy": 0.2}, 5: {"actor/entropy": 0.1}}, 5, 5),
    ("kl_grows_reward_flat", 5,
     {s: {"actor/kl": kl, "reward/mean": 0.3} for s, kl in zip(range(1, 6), (0.001, 0.005, 0.01, 0.02, 0.04),
                                                                  strict=True)}, 4, 5),
    ("all_truncated", 5, {s: {"rollout/truncated_rate": 0.95} for s in (1, 3, 4, 5)}, 5, 5),
]


@pytest.mark.parametrize("name, steps, change, first, last", CASES, ids=[c[0] for c in CASES])
def test_each_sign_holds_from_the_step_it_first_shows(name: str, steps: int, change: dict, first: int,
                                                      last: int) -> None:
    signs = find_learning_signs(run_of(steps, change))
    assert [(s.name, s.step, s.last_step) for s in signs] == [(name, first, last)]
    assert signs[0].lever and any(ch.isdigit() for ch in signs[0].evidence)
    # One step fewer of the sign: not yet.
    assert [s.name for s in find_learning_signs(run_of(first - 1, change))] == []


def test_the_signs_name_their_numbers_and_levers() -> None:
    signs = {s.name: s for s in find_learning_signs(run_of(6, CASES[0][2]))}
    sign = signs["no_reward_variance"]
    assert "steps 2-4" in sign.evidence and "reward/mean 0, 0, 0" in sign.evidence
    assert "rollout.dynamic_sampling" in sign.lever and "task_reader.curriculum" in sign.lever
    assert "rollout.temperature" in sign.lever and "rollout.n" in sign.lever


def test_what_is_not_a_sign() -> None:
    # Tools never called, but none offered: not a tool task.
    no_offer = {s: {"agent/tool_call_rate": 0.0, "agent/tool_offer_rate": None, "agent/valid_tool_call_rate": None}
                for s in range(1, 6)}
    # A low entropy once the tasks are solved is convergence.
    solved = {s: {"actor/entropy": 0.05, "success/rate": 0.95} for s in range(3, 6)}
    # The KL grows while the reward rises.
    rising = {s: {"actor/kl": 0.01 * 2**s} for s in range(1, 6)}
    # Invalid calls that still succeed sometimes; a NaN clip fraction is no evidence.
    succeeding = {s: {"agent/valid_tool_call_rate": 0.0, "success/rate": 0.2} for s in range(1, 6)}
    nan_clip = {s: {"actor/clip_frac": float("nan")} for s in range(1, 6)}
    # Distillation: equal rewards, but the teacher scores every token (distill/tokens).
    distilled = {s: {"reward/zero_std_frac": 1.0, "reward/mean": 0.0, "distill/tokens": 400.0} for s in range(1, 6)}
    for change in (no_offer, solved, rising, succeeding, nan_clip, distilled):
        assert find_learning_signs(run_of(5, change)) == []


def test_a_relogged_step_keeps_its_last_row() -> None:
    rows = run_of(3, {s: {"rollout/truncated_rate": 1.0} for s in (1, 2, 3)})
    assert [s.name for s in find_learning_signs(rows)] == ["all_truncated"]
    rows.append(healthy(3))  # a resumed run logged step 3 again
    assert find_learning_signs(rows) == []


def test_the_monitor_warns_once_per_sign(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LearningSignsMonitor()
    change = {s: {"reward/zero_std_frac": 1.0 if s <= 5 else 0.5, "rollout/truncated_rate": 1.0 if s >= 5 else 0.0}
              for s in range(1, 8)}
    active = []
    with caplog.at_level(logging.WARNING, logger="ajet.outputs.learning_signs"):
        for row in run_of(8, change):
            step = row.pop("step")
            row.pop("split")
            monitor.observe(step, row)
            active.append(list(monitor.active))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("step 3: ") and "no_reward_variance" in warnings[0]
    assert "rollout.dynamic_sampling" in warnings[0]
    assert warnings[1].startswith("step 7: ") and "all_truncated" in warnings[1] and "rollout.max_tokens" in warnings[1]
    assert active == [[], [], ["no_reward_variance"], ["no_reward_variance"], ["no_reward_variance"], [],
                      ["all_truncated"], []]


def test_a_resumed_monitor_continues_from_the_earlier_steps(caplog: pytest.LogCaptureFixture) -> None:
    earlier = run_of(2, {s: {"reward/zero_std_frac": 1.0} for s in (1, 2)})
    earlier.append({"step": 2, "split": "val", "val/reward/mean": 0.0})
    monitor = LearningSignsMonitor(earlier)
    with caplog.at_level(logging.WARNING, logger="ajet.outputs.learning_signs"):
        new = monitor.observe(3, healthy(3, **{"reward/zero_std_frac": 1.0}))
    assert [s.name for s in new] == ["no_reward_variance"] and len(caplog.records) == 1


class _Schedule:
    def get_last_lr(self) -> list[float]:
        return [1e-5]

    def step(self) -> None:
        pass


def test_the_training_loop_warns_and_shows_the_sign_on_the_progress_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = AjetConfig()
    cfg.trainer.total_steps, cfg.logging.tensorboard, cfg.logging.quiet = 4, False, True
    cfg.trainer.save_final_model, cfg.trainer.val_every = False, 0
    closers = Closers()
    loop = TrainingLoop(cfg, tmp_path, closers, total_steps=4)
    loop.attach(None, None, None, _Schedule())
    loop.save_checkpoint = lambda: None  # nothing to save here
    with caplog.at_level(logging.INFO):
        with loop.steps() as steps:
            for _ in steps:
                loop.commit({"reward/mean": 0.0, "reward/zero_std_frac": 1.0})
    closers.close_all()
    warned = [r.getMessage() for r in caplog.records if r.name == "ajet.outputs.learning_signs"]
    assert len(warned) == 1 and warned[0].startswith("step 3: ")
    lines = [r.getMessage() for r in caplog.records if r.name == "ajet.progress"]
    assert "not learning?" not in lines[1]
    assert "not learning? no_reward_variance" in lines[2] and "not learning? no_reward_variance" in lines[3]


def test_the_progress_line_names_the_signs(caplog: pytest.LogCaptureFixture) -> None:
    progress = TrainingProgress(5, 0, quiet=True)
    with caplog.at_level(logging.INFO, logger="ajet.progress"):
        progress.step_done(1, {"reward/mean": 0.5})
        progress.step_done(2, {"reward/mean": 0.5}, signs=["no_tool_calls", "all_truncated"])
    progress.close()
    first, second = (r.getMessage() for r in caplog.records)
    assert "not learning" not in first
    assert "not learning? no_tool_calls, all_truncated" in second


def write_run(run: Path, rows: list[dict]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


TRUNCATED = {s: {"rollout/truncated_rate": 1.0} for s in range(1, 5)}


def test_the_summary_lists_the_signs(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [*run_of(4, TRUNCATED), {"step": 4, "split": "val", "val/success/rate": 0.5}])
    result = CliRunner().invoke(summary_app, [str(run)], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "signs that the run was not learning:" in result.output
    assert "all_truncated (steps 3-4): rollout/truncated_rate 1, 1, 1 at steps 1-3" in result.output
    assert "rollout.max_tokens" in result.output
    healthy_run = write_run(tmp_path / "healthy", run_of(4, {}))
    result = CliRunner().invoke(summary_app, [str(healthy_run)], terminal_width=400)
    assert result.exit_code == 0 and "not learning" not in result.output


def test_a_pipeline_summary_lists_the_signs_of_each_training_stage(tmp_path: Path) -> None:
    grpo = write_run(tmp_path / "stages" / "grpo", run_of(4, TRUNCATED))
    sft = write_run(tmp_path / "stages" / "sft", [{"step": 1, "split": "train", "sft/loss": 1.0}])
    pipeline = tmp_path / "pipeline"
    pipeline.mkdir()
    stages = [{"name": "sft", "run_dir": str(sft)}, {"name": "grpo", "run_dir": str(grpo)}]
    (pipeline / "pipeline.json").write_text(json.dumps({"stages": stages}))
    summary = summarize_run(pipeline)
    assert [(label, sign.name, sign.step) for label, sign in summary.signs] == [("grpo", "all_truncated", 3)]


def test_the_report_shows_the_signs(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", run_of(4, TRUNCATED))
    healthy_run = write_run(tmp_path / "healthy", run_of(4, {}))
    report = write_report([run, healthy_run], out_dir=tmp_path / "report")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    signs = {r["name"]: r["learning_signs"] for r in summary["runs"]}
    assert [(s["name"], s["step"], s["last_step"]) for s in signs["run"]] == [("all_truncated", 3, 4)]
    assert signs["healthy"] == []
    page = report.read_text()
    assert 'id="learning-signs"' in page and "<code>all_truncated</code>" in page and "rollout.max_tokens" in page
    write_report([healthy_run], out_dir=tmp_path / "report_healthy")
    assert "No sign that a run was not learning" in (tmp_path / "report_healthy" / "report.html").read_text()


def episode(i: int, group: str, reward: float, *, truncated: bool = False, offered: bool = False) -> Episode:
    return Episode(episode_id=f"e{i}", task=WorkflowTask(task_id=group, main_query="q"), group_id=group,
                   reward=reward, num_calls=1, truncated=truncated, offered_tools=offered)


def test_the_rollout_logs_the_metrics_the_signs_read() -> None:
    episodes = [episode(0, "a", 1.0, truncated=True, offered=True), episode(1, "a", 1.0),
                episode(2, "b", 0.0, truncated=True), episode(3, "b", 1.0),
                episode(4, "c", 0.5)]  # a group of one: no variance either
    metrics = RolloutResult(episodes=episodes, ok_episodes=episodes).metrics()
    assert metrics["reward/zero_std_frac"] == pytest.approx(2 / 3)
    assert (metrics["success/all_group_frac"], metrics["success/none_group_frac"]) == (0.0, 1.0)  # no is_success
    assert metrics["rollout/truncated_rate"] == pytest.approx(2 / 5)
    assert metrics["agent/tool_offer_rate"] == pytest.approx(1 / 5)
    no_tools = RolloutResult(episodes=episodes[1:], ok_episodes=episodes[1:]).metrics()
    assert "agent/tool_offer_rate" not in no_tools


def test_the_rollout_says_whether_its_groups_were_all_solved_or_all_failed() -> None:
    solved = {0: True, 1: True, 2: False, 3: True, 4: False, 5: False}  # a: all, b: one of two, c: none
    episodes = [replace(episode(i, g, 1.0 if solved[i] else 0.0), is_success=solved[i])
                for i, g in enumerate("aabbcc")]
    failed = replace(episode(6, "d", 0.0), status=TIMEOUT)  # not ok: its group is not counted
    metrics = RolloutResult(episodes=[*episodes, failed], ok_episodes=episodes).metrics()
    assert metrics["success/all_group_frac"] == pytest.approx(1 / 3)
    assert metrics["success/none_group_frac"] == pytest.approx(1 / 3)
    assert metrics["reward/zero_std_frac"] == pytest.approx(2 / 3)


class _Tracker:
    def __init__(self, calls: list[LLMCall]) -> None:
        self.calls = calls

    def stats(self) -> dict:
        return {}

    def timelines(self) -> list:
        return []


def call(finish: str, tools: list | None = None) -> LLMCall:
    return LLMCall(role="default", prompt_ids=[1], completion_ids=[2], completion_logprobs=[0.0],
                   finish_reason=finish, policy_version=0, tools=tools)


@pytest.mark.parametrize("calls, truncated, offered", [
    ([call("length"), call("stop")], False, False),  # only an earlier reply was cut
    ([call("tool_calls", tools=[{"type": "function", "function": {"name": "f"}}]), call("length")], True, True),
    ([], False, False),
])
def test_the_episode_records_a_cut_last_reply_and_offered_tools(calls: list, truncated: bool,
                                                                 offered: bool) -> None:
    ep = Episode(episode_id="e0", task=WorkflowTask(task_id="t", main_query="q"), group_id="t")
    collect_tracker(ep, _Tracker(calls))
    assert (ep.truncated, ep.offered_tools) == (truncated, offered)
