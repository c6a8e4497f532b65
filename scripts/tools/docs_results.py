"""The tables of docs/results/learning.md, generated from the benchmark JSON that the learning
benches commit under docs/learning/, so that a figure on the page cannot drift from its run.

    .venv/bin/python -m scripts.tools.docs_results           # rewrite the generated blocks
    .venv/bin/python -m scripts.tools.docs_results --check   # exit 1 when the page is stale

Sources (every committed copy: docs/learning/ and its subfolders, one run or seed each):
- bench_learning.json (scripts/bench/learning.py): one row a run: the test metric base ->
  trained with their 95 % intervals and the gain's (rows since 2026-12-06; older rows recorded
  no per-task scores and say so), minutes, the verdict against the threshold, the date, the
  CPU, the ajet argv it ran, and the episodes that would resolve a +0.10 gain at its variance;
- bench_vs_trl.json (scripts/bench/vs_trl.py): test success at each minute mark, per
  method, with the date and the CPU flags;
- bench_distill.json (scripts/bench/distill.py): test success against training minutes, per
  method and seed, with the CPU; it records no date (the measurement log's is shown, marked).

A row's command is the bench command that reruns it, rebuilt from what its JSON recorded (the
example's name, the seed, the output folder); the exact argv of a bench_learning run is in its
JSON. The speed benchmarks commit no JSON: docs/results/speed.md is written by hand.
Standard library only (and the learning bench's registry, its verdict's text and
scripts.bench.common, which are), but for numpy in scripts.bench.stats.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from scripts.bench.common import REPO, fmt, markdown_table
from scripts.bench.learning import REGISTRY
from scripts.bench.learning_verdict import (
    RECORDED_BEFORE,
    gain_text,
    intervals,
    score_text,
    why_no_interval,
)
from scripts.bench.stats import episodes_to_resolve, paired_variance
from scripts.tools.docs_blocks import run

LEARNING = REPO / "docs" / "learning"
PAGE = REPO / "docs" / "results" / "learning.md"
MODULE = "scripts.tools.docs_results"

# bench_distill.json has no date; the measurement log's, for each committed copy.
DISTILL_DATES = {
    "bench_distill.json": ("2026-11-25", "2026-11-25_distillation_vs_grpo_and_sft.md"),
    "overlap/bench_distill.json": ("2026-11-25", "2026-11-25_decode_openmp_and_overlap.md"),
    "overlap_amx/bench_distill.json": ("2026-11-28", "2026-11-25_decode_openmp_and_overlap.md"),
}
# Test metrics of a row's `also` shown beside its main one (the rest are in bench_learning.md).
ALSO_SHOWN = {"workflow/summary_recall": "summary recall", "workflow/werewolves_win": "werewolves' win rate"}
METHOD_NAMES = {"ajet": "ajet (`math_agent_rl.yaml`)", "trl": "TRL `GRPOTrainer(tools=[calculate])`",
                "trl_helped": "TRL helped (easy tasks, a shaping reward)"}
TEACHER = "experiments/math_agent/stages/03_grpo/final_model"


def sources(name: str) -> list[Path]:
    """Every committed copy of docs/learning/NAME: the main one first, then its subfolders'."""
    main = LEARNING / name
    return ([main] if main.is_file() else []) + sorted(LEARNING.glob(f"*/{name}"))


def out_option(path: Path) -> str:
    """The bench's --out for a copy outside docs/learning/ itself ("" for the default)."""
    return "" if path.parent == LEARNING else f" --out {path.parent.relative_to(REPO)}"


def cpu(model: str, flags: list[str]) -> str:
    """`Intel Xeon, AMX`, `AMD EPYC, AVX-512 + avx512_bf16`, `AMD EPYC, AVX2 only`: the CPU model
    and the widest instruction set its recorded flags show."""
    name = re.sub(r"\((R|TM)\)|\b(Processor|CPU)\b", "", model)
    name = re.sub(r"\s+", " ", name).strip() or "CPU model not recorded"
    if "amx_tile" in flags:
        isa = "AMX"
    elif "avx512_bf16" in flags:
        isa = "AVX-512 + avx512_bf16"
    elif "avx512f" in flags:
        isa = "AVX-512"
    elif "avx2" in flags:
        isa = "AVX2 only"
    else:
        isa = "flags not recorded"
    return f"{name}, {isa}"


# ---------------------------------------------------------------------- bench_learning


def base_name(name: str) -> str:
    return re.sub(r"_seed\d+$", "", name)


def option(argv: list[str], key: str) -> str:
    """The value of `key=...` in an ajet argv ("" when absent)."""
    return next((a.split("=", 1)[1] for a in argv if a.startswith(key + "=")), "")


def what_ran(argv: list[str]) -> str:
    conf = Path(argv[argv.index("--conf") + 1]).name if "--conf" in argv else "?"
    if "serve" in argv:
        return f"`{conf}`: ajet eval, ajet serve + clients, ajet eval"
    if "--backbone=tinker" in argv:  # learning.py's OnTinker: warm-up and evaluations on debug
        return f"`{conf}`: sft, eval, grpo on --backbone=tinker (ajet tinker), ajet eval"
    return f"`{conf}`: {option(argv, 'pipeline.stages').strip('[]').replace(',', ', ')}"


def learning_row(r: dict[str, Any], path: Path) -> list[str]:
    seed = int(option(r["command"], "project.seed") or 0)
    command = (f"`.venv/bin/python -m scripts.bench.learning --only {base_name(r['name'])}"
               + (f" --seed {seed}" if seed else "") + (" --cached-base" if r["base_cached"] else "")
               + out_option(path) + "`")
    result = f"{base_name(r['name'])}" + (f" (seed {seed})" if seed else "")
    intervals = r.get("intervals", {})
    score = (f"{score_text(r['base'], intervals.get('base'))}{' (cached)' if r['base_cached'] else ''} -> "
             f"{score_text(r['trained'], intervals.get('trained'))}")
    also = [f"{label} {fmt(r['also'][key][0])} -> {fmt(r['also'][key][1])}"
            for key, label in ALSO_SHOWN.items() if key in r.get("also", {})]
    over = ", over" if r["minutes"] > r["budget_min"] else ""
    machine = r.get("machine") or {}
    return [result, what_ran(r["command"]), f"test {r['metric']}", "; ".join([score, *also]),
            gain_text(r["base"], r["trained"], intervals), episodes_needed(r),
            f"{r['minutes']:.1f} ({r['budget_min']:g}{over})",
            f"{r['status']} ({r['threshold_text']})", cpu(machine.get("cpu", ""), machine.get("avx", [])),
            r["date"][:10] or "not recorded", command]


def latest_learning_rows() -> tuple[list[tuple[dict[str, Any], Path]], list[str]]:
    """The latest row per run name, machine type and file (a copy the bench wrote with --out, e.g. a
    fresh clone's run, keeps its row beside the main file's) of every registry example, in registry
    order, with the file it came from; and the names of rows no longer in the registry."""
    registry = [e.name for e in REGISTRY]
    latest: dict[tuple[str, str, Path], tuple[dict[str, Any], Path]] = {}
    others = []
    for path in sources("bench_learning.json"):
        for r in json.loads(path.read_text())["results"].values():
            if base_name(r["name"]) not in registry:
                others.append(r["name"])
                continue
            machine = r.get("machine") or {}
            key = (r["name"], cpu(machine.get("cpu", ""), machine.get("avx", [])), path)
            if key not in latest or r["date"] > latest[key][0]["date"]:
                latest[key] = (r, path)
    order = sorted(latest.values(), key=lambda rp: (registry.index(base_name(rp[0]["name"])), rp[0]["name"],
                                                    rp[0]["date"]))
    return order, others


def bench_learning_block() -> str:
    """One row a run of an example in the registry: the latest per run name and machine type."""
    registry = [e.name for e in REGISTRY]
    order, others = latest_learning_rows()
    headers = ["run", "what ran (YAML: stages)", "metric", "base -> trained [95% CI]", "gain [95% CI]",
               "±0.10 needs", "minutes (budget)", "result (threshold)", "CPU", "date", "command"]
    lines = markdown_table(headers, [learning_row(r, p) for r, p in order])
    cores = {(r.get("machine") or {}).get("cores") for r, _ in order}
    ran = {base_name(r["name"]) for r, _ in order}
    never = [name for name in registry if name not in ran]
    lines += ["", f"Cores: {', '.join(str(c) for c in sorted(cores, key=str))} in every row."
              if len(cores) == 1 else f"Cores: {sorted(cores, key=str)}."]
    if never:
        lines.append(f"In the bench's registry, not yet run: {', '.join(never)}.")
    if others:
        lines.append(f"In the JSON but no longer in the registry (settings since replaced; the log has them): "
                     f"{', '.join(others)}.")
    before = [r for r, _ in order if r["trained"] is not None and not r.get("judged")]
    if before:
        lines.append(f"No CI in {len(before)} of {len(order)} rows: {RECORDED_BEFORE} (2026-12-06); their result is "
                     "the point rule's (trained >= threshold), and a rerun gives them an interval.")
    lines += [f"No CI in {r['name']}: {why_no_interval(r['judged'])}; its result is the point rule's."
              for r, _ in order if r["trained"] is not None and r.get("judged") and why_no_interval(r["judged"])]
    return "\n".join(lines)


BOUND = "bound from the rates"


def recomputed_intervals(r: dict[str, Any]) -> dict[str, list[float]] | None:
    """A recorded row's intervals as the bootstrap gives them now, from its recorded per-task scores
    (a test compares them with the recorded ones)."""
    return intervals(r["scores"], r["base"] if r["base_cached"] else None)


def pair_variance(r: dict[str, Any]) -> tuple[float, str] | None:
    """The variance of one episode pair's gain (trained - base) of a row, and where it comes from:
    its per-task scores (a task's gain variance times its episodes), or without them a bound from
    its two rates (p(1 - p) each, the most a score in [0, 1] with mean p varies, base and trained
    independent). None without both figures."""
    scores = r.get("scores") or {}
    if scores.get("base") and len(scores.get("trained", {})) >= 2:
        variance, tasks, episodes = paired_variance(scores["base"], scores["trained"])
        return variance * episodes, f"per-task scores, {tasks} tasks x {episodes:g}"
    if r["base"] is None or r["trained"] is None or r["base_cached"]:
        return None
    rates = [min(1.0, max(0.0, v)) for v in (r["base"], r["trained"])]
    return sum(p * (1 - p) for p in rates), BOUND


def episodes_needed(r: dict[str, Any]) -> str:
    """The episodes (tasks x episodes) whose 95 % gain interval is +-0.10 wide, at the row's variance
    ("bound" when it comes from the rates); "—" without both figures or without any spread."""
    found = pair_variance(r)
    if found is None or found[0] <= 0:
        return "—"
    return f"{episodes_to_resolve(found[0]):,}" + (" (bound)" if found[1] == BOUND else "")


# ---------------------------------------------------------------------- bench_vs_trl


def bench_vs_trl_block() -> str:
    runs = [(json.loads(p.read_text()), p) for p in sources("bench_vs_trl.json")]
    runs.sort(key=lambda dp: (dp[0]["date"], str(dp[1])))
    marks = sorted({float(m) for data, _ in runs for curve in data["curves"].values() for m in curve})
    rows = []
    for data, path in runs:
        methods = list(data["curves"])
        command = (f"`.venv/bin/python -m scripts.bench.vs_trl --methods {','.join(methods)}"
                   + (f" --seed {data['seed']}" if data["seed"] else "") + out_option(path) + "`")
        for method, curve in data["curves"].items():
            values = {float(m): v for m, v in curve.items()}
            rows.append([METHOD_NAMES.get(method, method), str(data["seed"]),
                         *(fmt(values.get(m)) for m in marks),
                         cpu("", data.get("cpu_flags", [])).replace("CPU model not recorded, ", ""),
                         data["date"][:10], command])
    headers = ["method", "seed", *(f"{m:g} min" for m in marks), "CPU (flags; model not recorded)", "date", "command"]
    return "\n".join(markdown_table(headers, rows))


# ---------------------------------------------------------------------- bench_distill


def bench_distill_block() -> str:
    rows, dated = [], set()
    for path in sources("bench_distill.json"):
        data = json.loads(path.read_text())
        rel = str(path.relative_to(LEARNING))
        date, log = DISTILL_DATES.get(rel, ("not recorded", ""))
        if log:
            dated.add(log)
        seeds = sorted({s for r in data["methods"].values() for s in r["runs"]}, key=int)
        command = (f"`.venv/bin/python -m scripts.bench.distill --teacher {TEACHER} --seeds {','.join(seeds)} "
                   f"--methods {','.join(data['methods'])}{out_option(path)}`")
        machine = data.get("machine") or {}
        for method, r in data["methods"].items():
            for index, (seed, points) in enumerate(r["runs"].items()):
                best = r["best"][index]
                end = points[-1] if points else None
                rows.append([method, seed, fmt(r["base"]),
                             f"{fmt(end and end['success'])} at {fmt(end and end['minutes'], 1)}",
                             f"{fmt(best and best['success'])} at {fmt(best and best['minutes'], 1)}",
                             fmt(data["teacher_success"]), cpu(machine.get("cpu", ""), machine.get("avx", [])),
                             f"{date} (log)" if log else date, command])
    headers = ["method", "seed", "base (test)", "end: test success at training minutes", "best at minutes",
               "teacher (test)", "CPU", "date", "command"]
    lines = markdown_table(headers, rows)
    if dated:
        lines += ["", "bench_distill.json records no date: the dates marked (log) are the measurement log's "
                  f"({', '.join(f'docs/log/{name}' for name in sorted(dated))})."]
    return "\n".join(lines)


def blocks() -> dict[Path, dict[str, str]]:
    """What this script writes: page -> {block key: markdown}."""
    return {PAGE: {"bench_learning": bench_learning_block(), "bench_vs_trl": bench_vs_trl_block(),
                   "bench_distill": bench_distill_block()}}


if __name__ == "__main__":
    sys.exit(run(blocks(), MODULE, sys.argv[1:], REPO))
