"""`ajet summary RUN_DIR`: the end-of-run table (before -> after), wall time and the commands,
for a training run dir and for a pipeline dir, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ajet.cli.summary import app
from ajet.outputs.summary import summarize_run

runner = CliRunner()


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def training_run(root: Path, *, records: bool = True) -> Path:
    run = root / "math agent"  # a space: the printed commands must quote it
    write_rows(run / "metrics.jsonl", [
        {"step": 0, "split": "val", "time": 100.0, "val/success/rate": 0.0625, "val/agent/tool_call_rate": 0.25},
        {"step": 1, "split": "train", "time": 160.0, "success/rate": 0.1, "agent/tool_call_rate": 0.5,
         "agent/calls_per_episode": 1.5},
        {"step": 2, "split": "train", "time": 220.0, "success/rate": 0.6, "agent/tool_call_rate": 1.0,
         "agent/calls_per_episode": 2.0, "agent/success_with_tool": 1.0},
        {"step": 2, "split": "val", "time": 250.0, "val/success/rate": 0.5625, "val/agent/tool_call_rate": 0.9375},
    ])
    if records:
        write_rows(run / "records" / "step_000002.jsonl", [{"episode_id": "e0"}])
    return run


def test_training_run_summary_table_wall_time_and_commands(tmp_path: Path) -> None:
    run = training_run(tmp_path)
    result = runner.invoke(app, [str(run), "--wall-s", "600"], terminal_width=200)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "step 0" in out and "step 2" in out
    assert "val success" in out and "0.062" in out and "0.562" in out and "+0.500" in out
    assert "val tool-call rate" in out and "+0.688" in out
    assert "train LLM calls / episode" in out and "1.500" in out and "2.000" in out
    assert "train successes using the tool" in out  # measured only at the end: shown with a dash
    assert "wall time: 10.0 min (600 s)" in out
    assert f"ajet view '{run}' --serve" in out
    assert f"ajet report '{run}'" in out


def test_without_token_records_there_is_nothing_to_view(tmp_path: Path) -> None:
    run = training_run(tmp_path, records=False)
    result = runner.invoke(app, [str(run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "no token records" in result.output and "ajet view" not in result.output
    assert "ajet report" in result.output
    assert summarize_run(run).wall_s == 150.0  # when not given: first to last metrics record
    assert "wall time: 2.5 min (150 s)" in result.output


def test_pipeline_summary_compares_the_first_and_last_eval(tmp_path: Path) -> None:
    run = tmp_path / "pipe"
    sft, grpo = run / "stages" / "02_sft", run / "stages" / "03_grpo"
    write_rows(sft / "metrics.jsonl", [{"step": 1, "split": "train", "time": 1.0, "sft/loss": 0.5}])
    write_rows(grpo / "metrics.jsonl", [{"step": 1, "split": "train", "time": 2.0, "reward/mean": 0.5}])
    write_rows(grpo / "records" / "step_000001.jsonl", [{"episode_id": "e0"}])
    reports = {"01_base": {"success/rate": 0.0, "agent/tool_call_rate": 0.0, "agent/calls_per_episode": 1.0},
               "04_grpo": {"success/rate": 0.5, "agent/tool_call_rate": 1.0, "agent/calls_per_episode": 2.0,
                           "agent/success_with_tool": 0.9}}
    for name, metrics in reports.items():
        write_rows(run / "eval" / f"eval_{name}.json", [{"name": name, "metrics": metrics}])
    stages = [
        {"stage": "eval", "index": 1, "model": "base", "eval": str(run / "eval" / "eval_01_base.json"), "seconds": 17.9},
        {"stage": "sft", "index": 2, "run_dir": str(sft), "model": str(sft / "final_model"), "seconds": 97.2},
        {"stage": "grpo", "index": 3, "run_dir": str(grpo), "model": str(grpo / "final_model"), "seconds": 71.6},
        {"stage": "eval", "index": 4, "model": "x", "eval": str(run / "eval" / "eval_04_grpo.json")},  # an older run's
    ]
    (run / "pipeline.json").write_text(json.dumps({"stages": stages}))
    result = runner.invoke(app, [str(run), "--wall-s", "90"], terminal_width=200)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "01_base" in out and "04_grpo" in out
    assert "val success" in out and "+0.500" in out
    assert "val successes using the tool" in out and "0.900" in out
    assert f"ajet view {grpo} --serve" in out
    assert f"ajet report {sft} {grpo}" in out
    assert "wall time: 1.5 min (90 s)" in out
    assert "stages: 01 eval 18 s, 02 sft 97 s, 03 grpo 72 s\n" in out


def test_pipeline_summary_names_the_eval_split(tmp_path: Path) -> None:
    """Eval stages on `eval.split: test` (the math agent's demo): the rows say test, not val."""
    run = tmp_path / "pipe"
    for name, rate in (("01_base", 0.0), ("03_grpo", 0.75)):
        write_rows(run / "eval" / f"eval_{name}.json",
                   [{"name": name, "split": "test", "metrics": {"success/rate": rate}}])
    stages = [{"stage": "eval", "index": i, "model": "m", "eval": str(run / "eval" / f"eval_{name}.json")}
              for i, name in ((1, "01_base"), (3, "03_grpo"))]
    (run / "pipeline.json").write_text(json.dumps({"stages": stages}))
    assert summarize_run(run).rows == [("test success", 0.0, 0.75)]


def test_stage_seconds_from_a_damaged_pipeline_json_are_left_out(tmp_path: Path) -> None:
    """Only a stage with a whole-number index and a number of seconds is timed in the summary; a
    hand-edited or damaged pipeline.json does not stop it."""
    run = tmp_path / "pipe"
    write_rows(run / "eval" / "eval_01_base.json", [{"name": "01_base", "metrics": {"success/rate": 0.0}}])
    stages = [{"stage": "eval", "index": 1, "model": "m", "eval": str(run / "eval" / "eval_01_base.json"), "seconds": 3.0},
              {"stage": "eval", "index": "2", "model": "m", "eval": str(run / "eval" / "eval_01_base.json"), "seconds": 4},
              {"stage": "eval", "index": 3, "model": "m", "eval": str(run / "eval" / "eval_01_base.json"), "seconds": "5"},
              {"stage": "eval", "index": 4, "model": "m", "eval": str(run / "eval" / "eval_01_base.json"), "seconds": True}]
    (run / "pipeline.json").write_text(json.dumps({"stages": stages}))
    assert summarize_run(run).stage_seconds == [("01 eval", 3.0)]


def test_not_a_run_dir_is_a_user_error(tmp_path: Path) -> None:
    result = runner.invoke(app, [str(tmp_path)])
    assert result.exit_code != 0
    assert "neither metrics.jsonl nor pipeline.json" in result.output
    assert "Traceback" not in result.output


def test_a_line_a_kill_cut_short_is_skipped_with_one_warning(tmp_path: Path, caplog) -> None:
    """A run killed mid-write leaves a torn last line; before, `ajet summary` failed on it
    with a JSONDecodeError."""
    run = training_run(tmp_path)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "split": "train", "time": 2')
    result = runner.invoke(app, [str(run), "--wall-s", "600"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "0.562" in result.output  # the whole lines are all there
    warned = [r.getMessage() for r in caplog.records if "malformed line" in r.getMessage()]
    assert len(warned) == 1 and "metrics.jsonl:5" in warned[0]
