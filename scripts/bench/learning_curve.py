"""The math agent's learning curve: success, tool-call rate and LLM calls per episode against
wall-clock minutes, one table per seed (the tables of docs/log/2026-11-23_math_agent_demo_and_grpo_alone.md).

    .venv/bin/python -m scripts.bench.learning_curve --seeds 0,1          # train, then print the tables
    .venv/bin/python -m scripts.bench.learning_curve --table RUN_DIR ...  # tables of finished runs

Each seed runs `ajet --conf CONF --backbone=debug project.seed=S project.name=NAME_seedS`
(plus any KEY=VALUE given after `--`) and records its launch time in RUN/launch.json, so
minutes count from the launch (model loading and every stage included). Points: every eval
stage of a pipeline (the time its report was written; on its report's split, e.g. test) and
every validation of a training stage (its metrics.jsonl row; on val). Each point says its
split (`split`, and in the label). Columns a point did not measure show "—" (a validation row
holds `val/agent/*` only when the trainer logs them).

The machine may be shared: the minutes are what this run took here, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench.common import AJET, REPO, child_env, fmt, markdown_table, read_jsonl

CONF = REPO / "tutorial" / "example_math_agent" / "math_agent.yaml"
COLUMNS = (  # (header, key in an eval report / a val row without "val/")
    ("success", "success/rate"),
    ("tool-call rate", "agent/tool_call_rate"),
    ("calls / episode", "agent/calls_per_episode"),
    ("successes using the tool", "agent/success_with_tool"),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", type=Path, default=CONF)
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds, one run each")
    parser.add_argument("--name", default="learning_curve/math_agent", help="project.name prefix")
    parser.add_argument("--exp-dir", default="experiments")
    parser.add_argument("--table", nargs="+", type=Path, help="only print the tables of these run dirs")
    parser.add_argument("--out", type=Path, help="also write the tables (markdown) to this file")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run (after --)")
    return parser.parse_args(argv)


def train(conf: Path, seed: int, name: str, exp_dir: str, overrides: list[str]) -> Path:
    run_dir = Path(exp_dir) / f"{name}_seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    launch = time.time()
    (run_dir / "launch.json").write_text(json.dumps({"time": launch, "seed": seed, "overrides": overrides}))
    cmd = [*AJET, "--conf", str(conf), "--backbone=debug",
           f"project.seed={seed}", f"project.name={name}_seed{seed}", f"project.exp_dir={exp_dir}",
           "logging.quiet=true", *overrides]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=child_env())
    print(f"seed {seed}: {time.time() - launch:.0f} s wall", flush=True)
    return run_dir


def points(run_dir: Path) -> list[dict]:
    """(minutes since launch, label, split, metrics) of every evaluation of the run, in time order;
    an eval stage's point also names its report (`report`: its episodes are the per-task scores)."""
    launch_file = run_dir / "launch.json"
    launch = json.loads(launch_file.read_text())["time"] if launch_file.is_file() else None
    out: list[dict] = []
    pipeline = run_dir / "pipeline.json"
    stages = json.loads(pipeline.read_text())["stages"] if pipeline.is_file() else [{"run_dir": str(run_dir)}]
    for stage in stages:
        if stage.get("eval"):
            report = Path(stage["eval"])
            data = json.loads(report.read_text())
            split = str(data.get("split") or "val")
            out.append({"time": report.stat().st_mtime, "label": f"eval {report.stem[5:]} ({split})",
                        "split": split, "metrics": data["metrics"], "report": report})
        elif stage.get("run_dir") and (Path(stage["run_dir"]) / "metrics.jsonl").is_file():
            out += _val_points(Path(stage["run_dir"]), stage.get("stage", "train"))
    out.sort(key=lambda p: p["time"])
    start = launch if launch is not None else (out[0]["time"] if out else 0.0)
    for p in out:
        p["minutes"] = (p["time"] - start) / 60
    return out


def _val_points(stage_dir: Path, stage: str) -> list[dict]:
    return [
        {"time": r["time"], "label": f"{stage} step {r['step']} (val)", "split": "val",
         "metrics": {k[4:]: v for k, v in r.items() if k.startswith("val/")}}
        for r in read_jsonl(stage_dir / "metrics.jsonl") if r.get("split") == "val" and "val/success/rate" in r
    ]


def table(run_dir: Path) -> str:
    rows = [[f"{p['minutes']:.1f}", p["label"], *(fmt(p["metrics"].get(key)) for _, key in COLUMNS)]
            for p in points(run_dir)]
    headers = ["minutes", "point", *(h for h, _ in COLUMNS)]
    return "\n".join([f"**{run_dir.name}**", "", *markdown_table(headers, rows)]) + "\n"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.table:
        run_dirs = list(args.table)
    else:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        run_dirs = [train(args.conf, s, args.name, args.exp_dir, args.overrides) for s in seeds]
    text = "\n".join(table(d) for d in run_dirs)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
