"""Does tinker-cookbook's RL recipe learn against `ajet tinker`? (issue 72's learning target)

Starts `ajet tinker` on the bundled model (a subprocess, a fresh state dir, a free port), then for
each seed runs the cookbook's own recipe, unmodified, from its environment (.venv-cookbook, `make
env-cookbook`):

    python -m tinker_cookbook.recipes.math_rl.train base_url=... model_name=<the served name>
        renderer_name=qwen3_instruct learning_rate=3e-4 groups_per_batch=16 group_size=4 seed=S

(its default environment: procedural "What is x + y?" questions with a one-shot example, reward 1
for the right number plus 0.1 x (format - 1), 5 tokens a reply). The hyper-parameters are the
recipe's except the batch (16 groups of 4, not 100: a step in seconds on 2 cores) and the learning
rate (3e-4, a common LoRA rate for a small model; the recipe's 1e-5 is for its 9B default). They
were set before the first run and not tuned.

Reward: each step's `env/all/reward/total` (the mean over its 64 episodes, sampled by the policy of
that step). The rise is the best mean of --window consecutive steps minus step 0's (the base
policy's). Target: a rise of >= --target (0.3) within --minutes (20) of wall time from the recipe's
launch (its start-up included), for every seed. A run stops once its rise reaches the target
(unless --keep-going) or at the budget; the table says when it got there.

    python -m scripts.bench.tinker_cookbook [--seeds 0,1] [--minutes 20] [--target 0.3] [--json FILE]

A benchmark measures; it exits 1 only when the cookbook or the service fails, not on a missed target.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ajet.launcher import LaunchError, free_port, wait_port
from ajet.outputs.metrics import read_jsonl
from scripts.bench.common import fmt, machine, print_table

REPO = Path(__file__).resolve().parents[2]
COOKBOOK_PYTHON = REPO / ".venv-cookbook" / "bin" / "python"
KEY = "tml-bench-tinker-cookbook"
RENDERER = "qwen3_instruct"  # SmolLM2's ChatML, token for token (tests/unit/test_tinker_cookbook.py)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled", help="what `ajet tinker --model` serves")
    parser.add_argument("--seeds", default="0,1", help="the recipe's seed=, one run each")
    parser.add_argument("--minutes", type=float, default=20.0, help="wall budget of a run")
    parser.add_argument("--target", type=float, default=0.3, help="the reward rise a run must reach")
    parser.add_argument("--window", type=int, default=3, help="steps averaged for the rise")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--groups", type=int, default=16, help="groups_per_batch")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rank", type=int, default=32, help="lora_rank (the recipe's default)")
    parser.add_argument("--keep-going", action="store_true", help="run each seed for the whole budget")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "bench_tinker_cookbook",
                        help="the service's state, the recipes' logs and metrics (emptied first)")
    return parser.parse_args(argv)


def start_service(model: str, state: Path, log: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """`ajet tinker` in a subprocess; (process, base URL, served model name) once it listens."""
    port = free_port()
    env = {**os.environ, "AJET_TINKER_API_KEY": KEY}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ajet")), "tinker", "--model", model, "--port", str(port),
                             "--state-dir", str(state)], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_port("ajet tinker", proc, "127.0.0.1", port, timeout_s=300)
        request = urllib.request.Request(f"{url}/api/v1/get_server_capabilities", headers={"X-API-Key": KEY})
        with urllib.request.urlopen(request, timeout=30) as response:
            models = json.loads(response.read())["supported_models"]
    except (LaunchError, OSError) as err:
        proc.kill()
        raise RuntimeError(f"ajet tinker did not start ({err}): {log.read_text()[-2000:]}") from None
    return proc, url, str(models[0]["model_name"])


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The recipe's step rows so far (a line being written is skipped)."""
    return [row for row in read_jsonl(path) if "env/all/reward/total" in row] if path.is_file() else []


def rise(steps: list[dict[str, Any]], window: int) -> float | None:
    """Best mean reward over `window` consecutive steps, minus step 0's."""
    rewards = [float(s["env/all/reward/total"]) for s in steps]
    if len(rewards) < window + 1:
        return None
    best = max(sum(rewards[i:i + window]) / window for i in range(1, len(rewards) - window + 1))
    return best - rewards[0]


def run_seed(args: argparse.Namespace, url: str, model_name: str, seed: int, out: Path) -> dict[str, Any]:
    log_path = out / f"math_rl_seed{seed}"
    cmd = [str(COOKBOOK_PYTHON), "-m", "tinker_cookbook.recipes.math_rl.train", f"base_url={url}",
           f"model_name={model_name}", f"renderer_name={RENDERER}", f"learning_rate={args.lr}",
           f"groups_per_batch={args.groups}", f"group_size={args.group_size}", f"lora_rank={args.rank}",
           f"seed={seed}", f"log_path={log_path}", "behavior_if_log_dir_exists=delete"]
    env = {**os.environ, "TINKER_API_KEY": KEY, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": ""}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=(out / f"seed{seed}.log").open("wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=out)
    reached: float | None = None
    steps: list[dict[str, Any]] = []
    seen = 0
    while True:
        time.sleep(2)
        minutes = (time.monotonic() - start) / 60
        steps = read_steps(log_path / "metrics.jsonl")
        if len(steps) > seen:
            seen = len(steps)
            r = rise(steps, args.window)
            print(f"  seed {seed}: step {len(steps) - 1} at {minutes:.1f} min, reward "
                  f"{steps[-1]['env/all/reward/total']:.3f}, rise {fmt(r)}", flush=True)
            if reached is None and r is not None and r >= args.target:
                reached = minutes
                if not args.keep_going:
                    break
        if proc.poll() is not None or minutes >= args.minutes:
            break
    failed = proc.poll() not in (None, 0)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if failed:
        raise RuntimeError(f"the recipe failed (seed {seed}); its log: {out / f'seed{seed}.log'}")
    times = [float(s.get("time/total", 0.0)) for s in steps]
    return {
        "seed": seed, "steps": len(steps), "minutes": round((time.monotonic() - start) / 60, 2),
        "reached_min": None if reached is None else round(reached, 2),
        "reward_step0": float(steps[0]["env/all/reward/total"]) if steps else None,
        "rise": rise(steps, args.window),
        "rewards": [round(float(s["env/all/reward/total"]), 4) for s in steps],
        "correct": [round(float(s.get("env/all/correct", 0.0)), 4) for s in steps],
        "s_per_step": round(sum(times) / len(times), 2) if times else None,
        "train_s_per_step": round(sum(float(s.get("time/train_step", 0.0)) for s in steps) / max(len(steps), 1), 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not COOKBOOK_PYTHON.is_file():
        print("tinker-cookbook's environment is missing: make env-cookbook", file=sys.stderr)
        return 1
    before = machine()
    runs = []
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    service, url, model_name = start_service(args.model, out / "state", out / "service.log")
    try:
        for seed in (int(s) for s in args.seeds.split(",")):
            runs.append(run_seed(args, url, model_name, seed, out))
    finally:
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(timeout=60)
        except subprocess.TimeoutExpired:
            service.kill()
    rows = [[str(r["seed"]), fmt(r["reward_step0"]), fmt(r["rise"]), str(r["steps"]), fmt(r["s_per_step"], 1),
             fmt(r["train_s_per_step"], 1), "-" if r["reached_min"] is None else f"{r['reached_min']:.1f}",
             f"{r['minutes']:.1f}", "pass" if r["reached_min"] is not None else "FAIL"] for r in runs]
    print_table(f"tinker-cookbook math_rl (arithmetic) against ajet tinker ({args.model}): reward rise >= {args.target} "
                f"within {args.minutes:g} min; rise = best {args.window}-step mean - step 0",
                ["seed", "reward, step 0", "rise", "steps", "s/step", "train s/step", f"min to +{args.target}",
                 "minutes run", "result"], rows, right=True)
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, {' '.join(m['avx'])}; load average before "
          f"{before['load_average']}, after {m['load_average']}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
                                         "machine": m, "load_before": before["load_average"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
