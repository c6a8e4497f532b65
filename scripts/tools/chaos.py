"""Chaos run: a tiny training in which episodes raise, hang, return NaN and call the model
after their end, killed with SIGKILL in the middle and resumed with --resume.

    python -m scripts.tools.chaos [--steps 6] [--kill-after 3] [--n 2] [--work-dir DIR] [--keep]

Ten tasks, all in every step (trainer.batch_size=10), each with a fate: 3 raise (30 % of the
episodes), 1 hangs in a thread that never returns (10 %), 1 returns reward=NaN (10 %), 1
calls the model again after its episode ended (10 %; the episode itself is ok), 4 are ok.
The model is a 2-layer random Llama with the bundled tokenizer (scripts.bench.common.tiny_model).

Asserts: the resumed run completes (exit 0); every step is in metrics.jsonl exactly once;
every step's failure counts are what was injected; every late call was refused; the final
weights are finite. Prints how long each run took and how long the process took to exit
after writing final_model/ (the hung threads must not hold it). Exit 0 when all hold.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from scripts.bench.common import AJET, child_env, read_jsonl, tiny_model

TASKS = ["raise"] * 3 + ["hang", "nan", "late"] + ["ok"] * 4

WORKFLOW = '''
import asyncio, random, threading
from pathlib import Path
from ajet import Workflow, WorkflowOutput

LATE_LOG = Path(__file__).with_name("late_calls.log")


class Chaos(Workflow):
    async def execute(self, task, tuner):
        fate = task.metadata["fate"]
        messages = [{"role": "user", "content": task.main_query}]
        await tuner(messages)  # every episode calls the model once
        if fate == "raise":
            raise RuntimeError(f"injected failure in {task.task_id}")
        if fate == "hang":  # a blocking call without timeout, handed to a thread
            await asyncio.to_thread(threading.Event().wait)
        if fate == "nan":
            return WorkflowOutput(reward=float("nan"))
        if fate == "late":
            asyncio.get_running_loop().create_task(call_later(tuner, messages))
        return WorkflowOutput(reward=random.random())


async def call_later(tuner, messages):
    await asyncio.sleep(0.3)  # the episode has ended by now
    try:
        await tuner(messages)
        outcome = "answered"
    except Exception as exc:  # what ajet answers a call after the end
        outcome = type(exc).__name__
    with LATE_LOG.open("a") as f:
        f.write(outcome + "\\n")
'''


def write_run(work: Path, steps: int, n: int, timeout_s: float) -> Path:
    model = tiny_model(work / "model")
    (work / "chaos_agent.py").write_text(WORKFLOW)
    (work / "train.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "question": f"Count to {i + 2}.", "fate": fate}) + "\n"
        for i, fate in enumerate(TASKS)))
    conf = work / "chaos.yaml"
    conf.write_text(
        f"project: {{name: chaos, exp_dir: {work / 'runs'}}}\n"
        f"model: {{path: {model}}}\n"
        "workflow: {target: chaos_agent.py:Chaos}\n"
        "task_reader: {jsonl: {train_path: train.jsonl}}\n"
        f"rollout: {{n: {n}, max_tokens: 8, episode_timeout_s: {timeout_s}, max_retries: 0}}\n"
        f"trainer: {{total_steps: {steps}, batch_size: {len(TASKS)}, save_every: 1, lr: 1.0e-4}}\n"
        "logging: {quiet: true, tensorboard: false}\n"
    )
    return conf


def ajet(conf: Path, *extra: str, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([*AJET, "--conf", str(conf), *extra], stdout=out, stderr=subprocess.STDOUT,
                                env=child_env(), cwd=conf.parent)


def train_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in read_jsonl(path) if r.get("split", "train") == "train"]


def kill_after(conf: Path, run_dir: Path, step: int, log: Path, limit_s: float) -> float:
    """Start a run, SIGKILL it once metrics.jsonl holds `step` (its checkpoint may be half
    written); returns the seconds it ran."""
    start = time.monotonic()
    proc = ajet(conf, log=log)
    while not any(r["step"] >= step for r in train_rows(run_dir)):
        if proc.poll() is not None:
            raise SystemExit(f"the first run ended (exit {proc.returncode}) before step {step}; "
                             f"see {log}")
        if time.monotonic() - start > limit_s:
            proc.kill()
            raise SystemExit(f"no step {step} within {limit_s:.0f}s; see {log}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return time.monotonic() - start


def resume(conf: Path, run_dir: Path, log: Path, limit_s: float) -> tuple[int, float, float | None]:
    """(exit code, seconds, seconds from final_model/ appearing to the process exit)."""
    start, final_seen = time.monotonic(), None
    proc = ajet(conf, "--resume", log=log)
    while proc.poll() is None:
        if final_seen is None and (run_dir / "final_model" / "config.json").exists():
            final_seen = time.monotonic()
        if time.monotonic() - start > limit_s:
            proc.kill()
            proc.wait()
            return 124, time.monotonic() - start, None
        time.sleep(0.05)
    end = time.monotonic()
    return proc.returncode, end - start, (end - final_seen) if final_seen else None


def check(run_dir: Path, work: Path, steps: int, n: int) -> list[str]:
    """Every broken promise, as a line."""
    problems = []
    rows = train_rows(run_dir)
    counts = Counter(r["step"] for r in rows)
    if sorted(counts) != list(range(1, steps + 1)) or set(counts.values()) != {1}:
        problems.append(f"metrics.jsonl steps (step: times): {dict(sorted(counts.items()))}; "
                        f"want 1..{steps} once each")
    fates = Counter(TASKS)
    want = {
        "rollout/episodes": len(TASKS) * n,
        "rollout/ok": (fates["ok"] + fates["late"]) * n,
        "rollout/failed/workflow_error:RuntimeError": fates["raise"] * n,
        "rollout/failed/timeout": fates["hang"] * n,
        "rollout/failed/bad_output": fates["nan"] * n,
        "rollout/failed": (fates["raise"] + fates["hang"] + fates["nan"]) * n,
    }
    for row in rows:
        got = {k: int(row.get(k, 0)) for k in want}
        if got != want:
            problems.append(f"step {row['step']}: failure counts {got}, injected {want}")
    late_log = work / "late_calls.log"
    late = Counter(late_log.read_text().split()) if late_log.is_file() else Counter()
    if not late or set(late) != {"SessionClosedError"}:
        problems.append(f"calls after the end of an episode: {dict(late)}; want all refused "
                        "with SessionClosedError")
    problems += weight_problems(run_dir / "final_model")
    return problems


def weight_problems(final: Path) -> list[str]:
    import torch
    from safetensors.torch import load_file

    files = sorted(final.glob("*.safetensors"))
    if not files:
        return [f"no weights in {final}"]
    bad = [name for f in files for name, t in load_file(f).items() if not torch.isfinite(t).all()]
    return [f"non-finite weights: {bad[:5]}"] if bad else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kill-after", type=int, default=3, help="SIGKILL once this step is logged")
    parser.add_argument("--n", type=int, default=2, help="episodes per task")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--limit-s", type=float, default=900, help="per run")
    parser.add_argument("--episode-timeout-s", type=float, default=30,
                        help="rollout.episode_timeout_s: each step waits this long for the hung "
                             "episodes; too short and a slow first step (imports, warm-up on a "
                             "busy CPU) times healthy episodes out")
    args = parser.parse_args()
    if not 1 <= args.kill_after < args.steps:
        parser.error("--kill-after must be in [1, --steps)")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="ajet-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        conf = write_run(work, args.steps, args.n, args.episode_timeout_s)
        run_dir = work / "runs" / "chaos"
        first_s = kill_after(conf, run_dir, args.kill_after, work / "run1.log", args.limit_s)
        print(f"run 1: SIGKILL after step {args.kill_after} was logged ({first_s:.1f} s)")
        rc, second_s, exit_s = resume(conf, run_dir, work / "run2.log", args.limit_s)
        shown = f"{exit_s:.2f} s" if exit_s is not None else "n/a"
        print(f"run 2 (--resume): exit {rc} after {second_s:.1f} s; "
              f"exit {shown} after final_model/ appeared")
        problems = [f"the resumed run exited {rc}; see {work / 'run2.log'}"] if rc else []
        problems += check(run_dir, work, args.steps, args.n)
        for line in problems:
            print(f"FAIL: {line}")
        if not problems:
            print("OK: completed; every step once; failure counts as injected; late calls "
                  "refused; weights finite")
        return 1 if problems else 0
    finally:
        if args.keep or args.work_dir:
            print(f"work dir: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
