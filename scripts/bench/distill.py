"""Signals from a teacher, compared on the math agent (issue 29 §2): held-out (test) success of
the base model trained three ways, against training minutes on the same CPU.

    .venv/bin/python -m scripts.bench.distill --teacher experiments/math_agent/stages/03_grpo/final_model
    .venv/bin/python -m scripts.bench.distill --teacher T --seeds 0 --methods distill   # one run
    .venv/bin/python -m scripts.bench.distill --reread                                  # tables again

The teacher is the math agent `make demo` trained; the student is the base model. Methods:

- `distill`: on-policy distillation, `math_agent_distill.yaml` (the teacher scores the
  student's own tokens; no reward);
- `grpo`: GRPO alone from the task reward, `math_agent_rl.yaml` as tuned on val (forced first
  call, curriculum, dynamic sampling: its own best settings, not the distill run's);
- `sft`: SFT on the teacher's sampled dialogs (off-policy distillation): `ajet eval --split
  train --dialogs` samples the teacher on the train tasks (its minutes count), then the SFT
  stage of `math_agent.yaml` (the demo's warm-up settings: 64 dialogs, lr 5e-5) trains on them;
- `grpo_overlap` (not a teacher method: issue 28's overlap on the same harness): `grpo` with
  `rollout.max_staleness=1`, the next step's rollout running during the update.

Each run's held-out points: the RL methods validate on the **test** split every
`trainer.val_every` steps (`task_reader.jsonl.val_path` pointed at test.jsonl: reporting only;
every setting was chosen on val before, see docs/log/2026-11-25_distillation_vs_grpo_and_sft.md), SFT is evaluated on test at
its end. The x axis is *training* minutes: wall minutes since the run's launch (model loading
included) minus the minutes its test validations took, so that measuring more often costs a
method nothing. The base model's test success (minute 0) is `ajet eval --split test` with the
method's own sampling settings (not timed).

Writes OUT/bench_distill.json, OUT/bench_distill.md (the table) and OUT/bench_distill.png;
prints the table; `scripts/tools/docs_results.py` then regenerates docs/results/learning.md from every
committed bench_distill.json. The machine may be shared: minutes are what the runs
took here (its CPU flags are recorded beside them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import (
    AJET,
    REPO,
    eval_metric,
    fmt,
    machine,
    markdown_table,
    pyplot,
    read_jsonl,
    save_figure,
)

EXAMPLE = REPO / "tutorial" / "example_math_agent"
TEST = EXAMPLE / "test.jsonl"
OUT = REPO / "docs" / "learning"
EXP = REPO / "experiments" / "bench_distill"
METHODS = ("distill", "grpo", "sft", "grpo_overlap")
CONF = {"distill": EXAMPLE / "math_agent_distill.yaml", "grpo": EXAMPLE / "math_agent_rl.yaml",
        "sft": EXAMPLE / "math_agent.yaml", "grpo_overlap": EXAMPLE / "math_agent_rl.yaml"}
# Pinned on top of each YAML (chosen on val: docs/log/2026-11-25_distillation_vs_grpo_and_sft.md).
PINNED = {
    "distill": ["pipeline.stages=[distill]", "trainer.total_steps=24", "trainer.val_every=4"],
    "grpo": ["pipeline.stages=[grpo]", "trainer.total_steps=24", "trainer.val_every=4"],
    "sft": ["pipeline.stages=[sft]"],
    # GRPO alone with the next step's rollout overlapped with the update (issue 28 §4): the same
    # config (its engine is fp16 and TIS is on), one version of staleness allowed.
    "grpo_overlap": ["pipeline.stages=[grpo]", "trainer.total_steps=24", "trainer.val_every=4",
                     "rollout.max_staleness=1"],
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", type=Path, help="the teacher checkpoint (make demo's final_model)")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--exp-dir", type=Path, default=EXP)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--reread", action="store_true", help="rebuild the outputs from the run dirs (no training)")
    return p.parse_args(argv)


def ajet(*args: str) -> float:
    """Run the CLI (`ajet --conf ...` quietly); return its wall seconds (raises on failure)."""
    start = time.monotonic()
    quiet = ["--quiet"] if args[0] == "--conf" else []
    subprocess.run([*AJET, *args[:2], *quiet, *args[2:]], check=True, cwd=REPO)
    return time.monotonic() - start


def run_dir(exp: Path, method: str, seed: int) -> Path:
    return exp / f"{method}_seed{seed}"


def train(method: str, seed: int, teacher: Path, exp: Path) -> None:
    """One training run; its launch time and timings go to RUN/bench.json."""
    run = run_dir(exp, method, seed)
    common = [f"project.exp_dir={exp}", f"project.name={run.name}", f"project.seed={seed}",
              "trainer.save_every=0", *PINNED[method]]
    info: dict[str, Any] = {"launch": time.time()}
    if method == "sft":
        dialogs = run / "teacher_dialogs.jsonl"
        info["dialogs_s"] = ajet("eval", "--conf", str(CONF["sft"]), "--model", str(teacher), "--split", "train",
                                 "--n", "1", "--name", "teacher_train", "--dialogs", str(dialogs),
                                 f"project.exp_dir={exp}", f"project.name={run.name}", f"project.seed={seed}")
        info["train_s"] = ajet("--conf", str(CONF["sft"]), "--backbone=debug", f"sft.train_path={dialogs}", *common)
        final = run / "stages" / "01_sft" / "final_model"
        info["eval_s"] = ajet("eval", "--conf", str(CONF["sft"]), "--model", str(final), "--split", "test",
                              "--name", "trained_test", f"project.exp_dir={exp}", f"project.name={run.name}",
                              f"project.seed={seed}")
    else:
        extra = [f"distill.teacher={teacher}"] if method == "distill" else []
        info["train_s"] = ajet("--conf", str(CONF[method]), "--backbone=debug", f"task_reader.jsonl.val_path={TEST}",
                               "trainer.val_n=1", *common, *extra)
    run.mkdir(parents=True, exist_ok=True)
    (run / "bench.json").write_text(json.dumps(info, indent=1))


def base_eval(method: str, exp: Path) -> float:
    """The base model's test success with the method's sampling settings (cached per method)."""
    method = "grpo" if method == "grpo_overlap" else method  # the same sampling settings
    name = f"base_{method}"
    report = exp / "base" / "eval" / f"eval_{name}.json"
    if not report.is_file():
        ajet("eval", "--conf", str(CONF[method]), "--split", "test", "--name", name, f"project.exp_dir={exp}",
             "project.name=base")
    return eval_metric(report)


def curve(method: str, seed: int, exp: Path) -> list[dict[str, float]]:
    """(training minutes, test success) of one run, in time order."""
    run = run_dir(exp, method, seed)
    info = json.loads((run / "bench.json").read_text())
    if method == "sft":
        minutes = (info["dialogs_s"] + info["train_s"]) / 60
        return [{"minutes": minutes, "success": eval_metric(run / "eval" / "eval_trained_test.json")}]
    stage = next((run / "stages").iterdir())
    out, spent, last_train = [], 0.0, info["launch"]
    for row in read_jsonl(stage / "metrics.jsonl"):
        if row.get("split") == "train":
            last_train = row["time"]
        elif row.get("split") == "val" and "val/success/rate" in row:
            spent += row["time"] - last_train  # the validation itself: not training time
            out.append({"minutes": (row["time"] - info["launch"] - spent) / 60, "success": float(row["val/success/rate"]),
                        "step": row["step"]})
    return out


def summarize(methods: list[str], seeds: list[int], exp: Path, teacher_success: float | None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for method in methods:
        same = "grpo" if method == "grpo_overlap" else method
        base = base_eval(method, exp) if (exp / "base" / "eval" / f"eval_base_{same}.json").is_file() else None
        runs = {}
        for seed in seeds:
            if (run_dir(exp, method, seed) / "bench.json").is_file():
                runs[seed] = curve(method, seed, exp)
        results[method] = {"base": base, "runs": runs}
    for r in results.values():
        for pts in r["runs"].values():
            best = max(pts, key=lambda p: (p["success"], -p["minutes"])) if pts else None
            r.setdefault("best", []).append(best)
            near = [p for p in pts if teacher_success is not None and p["success"] >= teacher_success - 0.05]
            r.setdefault("to_teacher", []).append(near[0]["minutes"] if near else None)
    return {"teacher_success": teacher_success, "machine": machine(), "methods": results}


def markdown(data: dict[str, Any]) -> str:
    teacher = data["teacher_success"]
    lines = [f"Teacher (make demo's model) on test: {fmt(teacher)}. Machine: {data['machine']['cpu']}, "
             f"{data['machine']['cores']} cores, flags {' '.join(data['machine']['avx'])}.", ""]
    rows = []
    for method, r in data["methods"].items():
        for index, (seed, pts) in enumerate(r["runs"].items()):
            points = ", ".join(f"{p['success']:.2f} @ {p['minutes']:.1f}" for p in pts)
            best = r["best"][index]
            rows.append([method, str(seed), fmt(r["base"]), points, fmt(best and best["success"]),
                         fmt(best and best["minutes"], 1), fmt(r["to_teacher"][index], 1)])
    lines += markdown_table(["method", "seed", "base (test)", "test success at training minutes", "best",
                             "minutes to best", "minutes to teacher - 0.05"], rows)
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(6.5, 3.8))
    colors = {"distill": "tab:green", "grpo": "tab:blue", "sft": "tab:orange", "grpo_overlap": "tab:purple"}
    for method, r in data["methods"].items():
        for index, (seed, pts) in enumerate(r["runs"].items()):
            xs = [0.0] + [p["minutes"] for p in pts]
            ys = [r["base"] or 0.0] + [p["success"] for p in pts]
            ax.plot(xs, ys, marker="o", ls="-" if index == 0 else "--", color=colors.get(method),
                    label=f"{method} seed {seed}")
    if data["teacher_success"] is not None:
        ax.axhline(data["teacher_success"], ls=":", color="tab:red", label="teacher")
    ax.set_xlabel("training minutes (2 CPU cores)")
    ax.set_ylabel("test success")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="upper left")
    save_figure(fig, path)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown method(s) {sorted(unknown)}; choose from {METHODS}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    exp = args.exp_dir.resolve()
    teacher_report = exp / "teacher" / "eval" / "eval_teacher_test.json"
    if not args.reread:
        if args.teacher is None or not (args.teacher / "config.json").is_file():
            raise SystemExit("--teacher must be a checkpoint directory (make demo's "
                             "experiments/math_agent/stages/03_grpo/final_model)")
        teacher = args.teacher.resolve()
        if not teacher_report.is_file():
            ajet("eval", "--conf", str(CONF["distill"]), "--model", str(teacher), "--split", "test", "--name",
                 "teacher_test", f"project.exp_dir={exp}", "project.name=teacher")
        for method in methods:
            base_eval(method, exp)
            for seed in seeds:
                train(method, seed, teacher, exp)
    teacher_success = eval_metric(teacher_report) if teacher_report.is_file() else None
    data = summarize(methods, seeds, exp, teacher_success)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_distill.json").write_text(json.dumps(data, indent=1) + "\n")
    text = markdown(data)
    (args.out / "bench_distill.md").write_text(text)
    plot(data, args.out / "bench_distill.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
