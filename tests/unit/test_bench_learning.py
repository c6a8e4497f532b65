"""scripts/bench/learning.py without training: its registry loads as configs with a test
split, a finished run dir is read into base -> trained, minutes, tokens, the per-task scores,
their intervals and the verdict, and the table, JSON, PNGs and markdown are written (a fake
runner stands in for the runs)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(script: Any) -> Any:
    return script("bench.learning")


def test_registry_pins_loadable_configs_with_a_test_split(bench: Any, tmp_path: Path) -> None:
    from ajet.cli.common import env_servers_running
    from ajet.config import load_config
    from ajet.launcher import free_port
    from ajet.task_reader import build_reader

    names = [e.name for e in bench.REGISTRY]
    assert len(names) == len(set(names))
    quick = [e for e in bench.REGISTRY if e.quick]
    assert quick and all(e.budget_min <= 6 for e in quick)  # checkable before a change lands
    for e in bench.REGISTRY:
        assert e.budget_min > 0 and 0 <= e.threshold <= 1 and e.why
        # an example with a service (the env server) reads its tasks from it: started as the bench does
        with bench.service(e, tmp_path / f"{e.name}.log") as port:
            if e.served is not None:  # ajet eval on test, ajet serve: the same config
                cmds = bench.served_commands(e, Path("/tmp/x"), port=8765, token="t")
                assert "--split" in cmds["base"] and cmds["base"][cmds["base"].index("--split") + 1] == "test"
                assert cmds["trained"][cmds["trained"].index("--model") + 1] == "/tmp/x/" + e.name + "/final_model"
                overrides = [o for o in cmds["base"] if "=" in o and not o.startswith("project.exp_dir")]
                cfg = load_config(REPO / e.conf, overrides)
                assert cfg.workflow.target and load_config(REPO / e.conf, [], require_workflow=False)
                assert e.stages == ("serve",)
            else:
                cmd = bench.command(e, Path("/tmp/x"), cached_base=False, port=port)
                overrides = cmd[cmd.index("--backbone=debug") + 1:]
                cfg = load_config(REPO / e.conf, [o for o in overrides if not o.startswith("project.exp_dir")])
                assert cfg.eval.split.value == "test"
                assert [getattr(s, "value", s) for s in cfg.pipeline.stages] == [*e.warmup, "eval", *e.stages, "eval"]
            if cfg.env.type.value == "verifiers":  # its server on a port of this test's own, as `ajet` starts it
                cfg.env.verifiers.port = free_port()
            with env_servers_running(cfg, tmp_path / f"{e.name}-services"):
                assert build_reader(cfg.task_reader, seed=0, env=cfg.env).test_tasks(), f"{e.name}: no test tasks"


def test_a_service_listens_while_its_run_runs_and_stops_after(bench: Any, tmp_path: Path) -> None:
    import httpx

    (e,) = bench.select("appworld")
    with pytest.raises(ValueError, match="needs its service's port"):
        bench.command(e, tmp_path, cached_base=False)
    with bench.service(e, tmp_path / "service.log") as port:
        assert f"task_reader.env_service.base_url=http://127.0.0.1:{port}" in bench.command(e, tmp_path, False, port)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["env_types"] == ["kv_store"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    broken = bench.replace(e, service=("-c", "import sys; print('no such server'); sys.exit(3)"))
    with pytest.raises(RuntimeError, match=r"did not listen(.|\n)*no such server"):
        with bench.service(broken, tmp_path / "broken.log"):
            pass


def test_command_skips_the_base_eval_with_a_cached_base(bench: Any) -> None:
    e = bench.REGISTRY[0]
    assert f"pipeline.stages=[eval,{','.join(e.stages)},eval]" in bench.command(e, Path("x"), False)
    assert f"pipeline.stages=[{','.join(e.stages)},eval]" in bench.command(e, Path("x"), True)


def test_a_warmup_runs_before_the_base_eval_which_cannot_be_cached(bench: Any) -> None:
    """Issue 55's rows measure what RL adds after a warm-up: their base is the warmed-up model's
    test score, so the warm-up runs first and the base is never a cached number."""
    (e,) = bench.select("frozenlake_step_credit")
    assert e.warmup == ("sft",) and e.stages == ("grpo",)
    assert "pipeline.stages=[sft,eval,grpo,eval]" in bench.command(e, Path("x"), False)
    with pytest.raises(ValueError, match="its base is its warm-up's score"):
        bench.command(e, Path("x"), True)


def test_select_and_unknown_names(bench: Any, capsys: pytest.CaptureFixture) -> None:
    assert [e.name for e in bench.select("adder")] == ["adder"]
    assert len(bench.select("")) == len(bench.REGISTRY)
    assert bench.main(["--only", "adder,nope"], runner=_never) == 2
    assert "unknown example(s) nope" in capsys.readouterr().err


def _never(*args: Any) -> Any:
    raise AssertionError("no run expected")


Scores = dict[str, list[float]]


def fake_run(root: Path, *, base: float, trained: float | None, launch: float = 1000.0,
             scores: tuple[Scores, Scores] | None = None) -> Path:
    """A pipeline run dir as ajet leaves it: [eval, grpo, eval], the reports on test; with
    `scores` (base's, trained's: task -> episodes' success), the reports list their episodes
    and their success/rate is the mean."""
    run = root / "run"
    grpo = run / "stages" / "02_grpo"
    grpo.mkdir(parents=True)
    (run / "launch.json").write_text(json.dumps({"time": launch}))
    rows = [{"step": 0, "split": "val", "time": launch + 60, "val/success/rate": 0.25},
            {"step": 1, "split": "train", "time": launch + 90, "context/tokens_merged": 3000.0,
             "context/tokens_packed": 1000.0},
            {"step": 2, "split": "train", "time": launch + 100, "actor/skipped_update": 1.0},  # no tokens
            {"step": 3, "split": "train", "time": launch + 120, "context/tokens_merged": 2500.0,
             "context/tokens_packed": 1500.0},
            {"step": 2, "split": "val", "time": launch + 130, "val/success/rate": 0.5}]
    (grpo / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stages = []
    for index, name, value, at in ((1, "01_base", base, 30), (3, "03_grpo", trained, 180)):
        if value is None:
            continue
        report = run / "eval" / f"eval_{name}.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {"name": name, "split": "test", "metrics": {"success/rate": value}}
        if scores is not None:
            by_task = scores[0 if index == 1 else 1]
            data["episodes"] = [{"task_id": task, "episode_id": f"{task}-{i}", "success": bool(v), "reward": v}
                                for task, values in by_task.items() for i, v in enumerate(values)]
            data["metrics"]["success/rate"] = sum(sum(v) for v in by_task.values()) / len(data["episodes"])
        report.write_text(json.dumps(data))
        os.utime(report, (launch + at, launch + at))
        stages.append({"stage": "eval", "index": index, "eval": str(report)})
        if index == 1:
            stages.append({"stage": "grpo", "index": 2, "run_dir": str(grpo)})
    (run / "pipeline.json").write_text(json.dumps({"stages": stages}))
    return run


def test_collect_reads_base_trained_tokens_and_the_curve(bench: Any, tmp_path: Path) -> None:
    adder = bench.select("adder")[0]
    result = bench.collect(adder, fake_run(tmp_path, base=0.1, trained=0.75), minutes=3.5, cached_base=False)
    assert (result.base, result.trained, result.tokens_trained, result.tokens_forwarded) == (0.1, 0.75, 5500, 2500)
    assert result.passed and result.status == "pass" and result.threshold == adder.threshold
    assert result.judged == "an eval report lists no episodes" and not result.intervals  # judged on the points
    assert [(p["split"], p["value"]) for p in result.points] == [
        ("test", 0.1), ("val", 0.25), ("val", 0.5), ("test", 0.75)]
    assert result.points[0]["minutes"] == pytest.approx(0.5) and result.points[-1]["minutes"] == pytest.approx(3.0)


def test_reread_rebuilds_a_result_from_the_run_dir(bench: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    run = fake_run(tmp_path / "exp", base=0.1, trained=0.75)
    run.rename(tmp_path / "exp" / "adder")
    run = tmp_path / "exp" / "adder"
    (run / "launch.json").write_text(json.dumps({"time": 1000.0, "end": 1000.0 + 300, "status": "ok",
                                                 "cached_base": False, "cmd": ["ajet"],
                                                 "machine": {"cores": 2, "load_average": [1.0, 1.0, 1.0]}}))
    # pipeline.json names the stage dirs where they were written: point them at the moved dir
    (run / "pipeline.json").write_text((run / "pipeline.json").read_text().replace(str(tmp_path / "exp" / "run"), str(run)))
    result = bench.reread(bench.select("adder")[0], tmp_path / "exp")
    assert (result.minutes, result.trained, result.status, result.command) == (5.0, 0.75, "pass", ["ajet"])
    assert result.machine["load_average"] == [1.0, 1.0, 1.0]  # as recorded by the run, not now
    out = tmp_path / "out"
    assert bench.main(["--only", "adder", "--reread", "--exp-dir", str(tmp_path / "exp"), "--out", str(out)],
                      runner=_never) == 0
    assert json.loads((out / "bench_learning.json").read_text())["results"]["adder"]["minutes"] == 5.0
    assert bench.main(["--only", "math_agent", "--reread", "--exp-dir", str(tmp_path / "exp")], runner=_never) == 2
    assert "no bench run" in capsys.readouterr().err


def test_below_the_threshold_or_without_the_final_eval_fails(bench: Any, tmp_path: Path) -> None:
    adder = bench.select("adder")[0]
    low = bench.collect(adder, fake_run(tmp_path / "a", base=0.1, trained=0.2), minutes=3, cached_base=False)
    assert not low.passed and low.status == "FAIL"
    cut = bench.collect(adder, fake_run(tmp_path / "b", base=0.1, trained=None), minutes=3, cached_base=False,
                        status="error: ajet exited 1")
    assert (cut.base, cut.trained, cut.passed, cut.status) == (0.1, None, False, "error: ajet exited 1")


def test_a_gain_threshold_is_relative_to_the_base(bench: Any, tmp_path: Path) -> None:
    lake = bench.select("frozenlake_rl")[0]
    assert lake.gain
    same = bench.collect(lake, fake_run(tmp_path / "a", base=0.25, trained=0.25), minutes=9, cached_base=False)
    assert same.passed and same.threshold == 0.25
    worse = bench.collect(lake, fake_run(tmp_path / "b", base=0.25, trained=0.125), minutes=9, cached_base=False)
    assert not worse.passed


def result(bench: Any, name: str, trained: float, **kw: Any) -> Any:
    e = bench.select(name)[0]
    fields = dict(name=name, metric=e.metric, base=0.0, trained=trained, minutes=4.25, tokens_trained=123456, tokens_forwarded=12345,
                  threshold=e.threshold, threshold_text=e.threshold_text(), budget_min=e.budget_min,
                  passed=trained >= e.threshold, status="pass" if trained >= e.threshold else "FAIL",
                  points=[{"minutes": 0.5, "label": "eval 01_base (test)", "split": "test", "value": 0.0},
                          {"minutes": 4.0, "label": "eval 03_grpo (test)", "split": "test", "value": trained}],
                  machine={"cores": 2})
    return bench.Result(**{**fields, **kw})


def test_main_writes_table_json_pngs_and_markdown(bench: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    ran: list[str] = []

    def runner(example: Any, exp_dir: Path, cached_base: bool) -> Any:
        ran.append(example.name)
        return result(bench, example.name, 0.8 if example.name == "adder" else 0.1)

    assert bench.main(["--only", "adder", "--out", str(out), "--exp-dir", str(tmp_path / "exp")], runner=runner) == 0
    printed = capsys.readouterr().out
    assert ran == ["adder"]
    assert "adder" in printed and "0.000 -> 0.800" in printed and "123,456" in printed and "pass" in printed
    data = json.loads((out / "bench_learning.json").read_text())
    saved = data["results"]["adder"]
    assert saved["trained"] == 0.8 and saved["minutes"] == 4.25 and saved["tokens_trained"] == 123456
    assert saved["machine"] == {"cores": 2} and len(saved["points"]) == 2
    assert (out / "bench_learning_adder.png").stat().st_size > 1000
    # a second run of another example keeps the first one's result; a miss exits 1
    assert bench.main(["--only", "math_agent", "--out", str(out)], runner=runner) == 1
    data = json.loads((out / "bench_learning.json").read_text())
    assert list(data["results"]) == ["adder", "math_agent"]
    md = (out / "bench_learning.md").read_text()
    assert "| adder | test success/rate | 0.000 -> 0.800 | +0.800 (no CI) | 4.2 / 6 | 123,456 | >= 0.50 | pass |" in md
    assert "| math_agent |" in md and "FAIL" in md and "![adder](bench_learning_adder.png)" in md


def test_over_budget_is_shown_not_failed(bench: Any) -> None:
    (row,) = bench.table_rows([result(bench, "adder", 0.9, minutes=7.5)])
    assert "7.5 / 6 (over budget)" in row and row[-1] == "pass"


def test_list_prints_every_example(bench: Any, capsys: pytest.CaptureFixture) -> None:
    assert bench.main(["--list"], runner=_never) == 0
    printed = capsys.readouterr().out
    assert all(e.name in printed for e in bench.REGISTRY) and "adder (quick)" in printed


def test_machine_names_the_cpu_and_its_avx_and_amx_flags(bench: Any) -> None:
    info = bench.machine()
    assert info["cores"] == os.cpu_count()
    assert all(flag.startswith(("avx", "amx")) for flag in info["avx"])
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), []) if Path("/proc/cpuinfo").is_file() else []
    assert sorted(f for f in flags if f.startswith(("avx", "amx"))) == info["avx"]


def test_a_second_seed_is_its_own_run_and_row_beside_the_first(bench: Any, tmp_path: Path) -> None:
    (e,) = bench.select("adder", seed=1)
    assert (e.name, e.seed) == ("adder_seed1", 1)
    cmd = bench.command(e, tmp_path, cached_base=False)
    assert "project.seed=1" in cmd and "project.name=adder_seed1" in cmd
    assert bench.select("adder")[0].seed == 0 and "project.seed=0" in bench.command(bench.select("adder")[0],
                                                                                    tmp_path, False)
    out = tmp_path / "out"
    for name in ("math_agent", "adder_seed1", "adder"):
        row = dataclasses.replace(result(bench, name.removesuffix("_seed1"), 0.8), name=name)
        bench.write_outputs([row], out)
    assert list(json.loads((out / "bench_learning.json").read_text())["results"]) == [
        "adder", "adder_seed1", "math_agent"]


def test_also_reports_more_test_metrics_base_and_trained(bench: Any, tmp_path: Path) -> None:
    """An example's `also` metrics come from the same first and last test evaluations; a metric an
    evaluation did not log is None, and with a cached base only the trained value is known."""
    wolves = bench.replace(bench.select("adder")[0], also=("workflow/valid_choices", "workflow/vote_hit/seer"))
    run = fake_run(tmp_path, base=0.5, trained=0.75)
    for name, valid in (("01_base", 0.2), ("03_grpo", 0.9)):
        report = run / "eval" / f"eval_{name}.json"
        data = json.loads(report.read_text())
        data["metrics"]["workflow/valid_choices"] = valid
        stamp = report.stat().st_mtime
        report.write_text(json.dumps(data))
        os.utime(report, (stamp, stamp))  # the points keep their order
    result = bench.collect(wolves, run, minutes=3, cached_base=False)
    assert result.also == {"workflow/valid_choices": [0.2, 0.9], "workflow/vote_hit/seer": [None, None]}
    cached = bench.collect(wolves, run, minutes=3, cached_base=True)
    assert cached.also["workflow/valid_choices"] == [None, 0.9]
    text = bench.markdown([result], {})
    assert "| adder | workflow/valid_choices | 0.200 -> 0.900 |" in text


def test_a_rows_checkpoints_go_once_it_is_read_unless_kept(bench: Any, tmp_path: Path) -> None:
    exp = tmp_path / "exp"

    def runner(example: Any, exp_dir: Path, cached_base: bool) -> Any:
        for stage in ("02_sft", "03_grpo"):
            ckpt = exp_dir / example.name / "stages" / stage / "checkpoints" / "step_000001"
            ckpt.mkdir(parents=True)
            (ckpt / "weights.pt").write_bytes(b"x" * 1000)
            (exp_dir / example.name / "stages" / stage / "final_model").mkdir()
        return result(bench, example.name, 0.8)

    assert bench.main(["--only", "adder", "--out", str(tmp_path / "out"), "--exp-dir", str(exp)], runner=runner) == 0
    stages = exp / "adder" / "stages"
    assert not list(stages.rglob("checkpoints")) and (stages / "03_grpo" / "final_model").is_dir()
    shutil.rmtree(exp)
    assert bench.main(["--only", "adder", "--out", str(tmp_path / "out"), "--exp-dir", str(exp), "--keep-checkpoints"],
                      runner=runner) == 0
    assert len(list(stages.rglob("checkpoints"))) == 2
    assert bench.drop_checkpoints(exp / "adder") == 2000 and not list(stages.rglob("checkpoints"))


def tasks(rates: list[float], episodes: int = 4) -> Scores:
    """Task -> `episodes` 0/1 scores whose mean is as near the task's rate as `episodes` allow."""
    return {f"t{i}": [1.0] * round(r * episodes) + [0.0] * (episodes - round(r * episodes))
            for i, r in enumerate(rates)}


def test_a_row_is_judged_on_its_gain_interval(bench: Any, tmp_path: Path) -> None:
    """frozenlake_step_credit asks for >= base + 0.10: pass when the whole gain interval is at or
    above 0.10, FAIL when below, inconclusive when it straddles it; the per-task scores and the
    intervals are recorded."""
    (e,) = bench.select("frozenlake_step_credit")
    base = tasks([0.25, 0.5, 0.0, 0.25] * 4)  # 16 maps x 4 episodes
    cases = {"pass": tasks([0.75, 1.0, 0.5, 0.75] * 4), "FAIL": base,
             "inconclusive": tasks([0.5, 0.75, 0.0, 0.25] * 4)}
    for want, trained in cases.items():
        run = fake_run(tmp_path / want, base=0, trained=0, scores=(base, trained))
        r = bench.collect(e, run, minutes=9, cached_base=False)
        assert (r.status, r.passed, r.judged) == (want, want == "pass", "interval"), r.intervals
        assert r.scores == {"base": base, "trained": trained}
        assert set(r.intervals) == {"base", "trained", "gain"}
        low, high = r.intervals["gain"]
        assert low <= r.trained - r.base <= high
    assert r.intervals["gain"][0] < 0.10 < r.intervals["gain"][1]  # the inconclusive one


def test_an_absolute_threshold_is_judged_on_the_trained_interval(bench: Any, tmp_path: Path) -> None:
    (adder,) = bench.select("adder")  # trained >= 0.50
    base = tasks([0.0] * 16)
    high = bench.collect(adder, fake_run(tmp_path / "a", base=0, trained=0, scores=(base, tasks([0.75, 1.0] * 8))),
                         minutes=3, cached_base=False)
    assert high.status == "pass" and high.intervals["trained"][0] >= 0.5
    near = bench.collect(adder, fake_run(tmp_path / "b", base=0, trained=0, scores=(base, tasks([0.25, 0.75] * 8))),
                         minutes=3, cached_base=False)
    assert near.status == "inconclusive" and near.intervals["trained"][0] < 0.5 < near.intervals["trained"][1]


def test_without_per_episode_scores_the_point_figures_decide_and_say_so(bench: Any, tmp_path: Path) -> None:
    """A metric the eval report has no per-episode score for (a workflow's behaviour metric), or a
    single test task: judged by the rule before intervals, and the row says why."""
    (e,) = bench.select("frozenlake_grpo_after_warmup")  # >= base
    run = fake_run(tmp_path / "a", base=0.25, trained=0.5, scores=(tasks([0.25] * 8), tasks([0.5] * 8)))
    for report in (run / "eval").iterdir():
        data, stamp = json.loads(report.read_text()), report.stat().st_mtime
        data["metrics"]["workflow/vote_hit/villager"] = 0.5
        report.write_text(json.dumps(data))
        os.utime(report, (stamp, stamp))
    behaviour = bench.collect(bench.replace(e, metric="workflow/vote_hit/villager"), run, minutes=9, cached_base=False)
    assert behaviour.judged == "workflow/vote_hit/villager has no per-episode score" and not behaviour.intervals
    one = bench.collect(e, fake_run(tmp_path / "b", base=0, trained=0, scores=({"t": [0.0, 1.0]}, {"t": [1.0, 1.0]})),
                        minutes=9, cached_base=False)
    assert (one.status, one.judged, one.intervals) == ("pass", "one test task", {})
    assert one.scores == {"base": {"t": [0.0, 1.0]}, "trained": {"t": [1.0, 1.0]}}


def test_the_tables_show_the_intervals_and_main_exits_1_only_on_a_fail(bench: Any, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    (e,) = bench.select("frozenlake_step_credit")
    base = tasks([0.25, 0.5, 0.0, 0.25] * 4)
    runs = {"inconclusive": tasks([0.5, 0.75, 0.0, 0.25] * 4), "FAIL": base}
    for want, trained in runs.items():
        rows = bench.collect(e, fake_run(tmp_path / want, base=0, trained=0, scores=(base, trained)),
                             minutes=9, cached_base=False)
        assert bench.main(["--only", e.name, "--out", str(tmp_path / "out")],
                          runner=lambda *a, row=rows: row) == (0 if want == "inconclusive" else 1)
    printed = capsys.readouterr().out
    assert "inconclusive (the interval straddles the threshold" in printed
    (row,) = bench.table_rows([rows])
    assert row[2] == "0.250 [0.16, 0.34] -> 0.250 [0.16, 0.34]" and row[3] == "+0.000 [0.00, 0.00]"
    old = dataclasses.replace(rows, scores={}, intervals={}, judged="")  # a row recorded before intervals
    (row,) = bench.table_rows([old])
    assert row[2] == "0.250 -> 0.250" and row[3] == "+0.000 (no CI)"
    assert ("frozenlake_step_credit: no CI (recorded before the bench kept per-task scores)"
            in bench.markdown([old], {}))


def test_per_task_scores_are_read_from_the_report_ajet_eval_writes(script: Any, tmp_path: Path) -> None:
    """The verdict reads the episodes `ajet.eval.metrics.write_report` writes: their mean over
    tasks of equal episodes is the report's success/rate and reward/mean (a failed episode 0)."""
    from ajet.eval.metrics import EpisodeResult, summarize, write_report

    verdict = script("bench.learning_verdict")
    results = [EpisodeResult(task_id=f"t{i % 3}", episode_id=f"e{i}", status="ok" if i != 4 else "timeout",
                             reward=[0.5, 1.0, 0.0][i % 3] if i != 4 else 0.0, success=i % 3 == 1 and i != 4, calls=1)
               for i in range(12)]
    metrics = summarize(results, k=4)
    report = tmp_path / "eval_x.json"
    write_report(report, name="x", model="m", split="test", n=4, temperature=1.0, metrics=metrics, results=results)
    for metric in ("success/rate", "reward/mean"):
        scores = verdict.task_scores(report, metric)
        assert sorted(scores) == ["t0", "t1", "t2"] and all(len(v) == 4 for v in scores.values())
        assert sum(sum(v) for v in scores.values()) / 12 == pytest.approx(metrics[metric])
    assert verdict.task_scores(report, "workflow/vote_hit/villager") == {}
