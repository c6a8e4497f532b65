"""Peak resident memory (RSS) of a training run, e.g. the math agent of `make demo`, and
what the big parts of it are.

Two modes:

- **run** (default): runs `ajet --conf CONF --backbone=debug` (plus any overrides) as a child
  process, samples its RSS every --interval seconds, and prints the peak, the peak of each
  phase the log names (pipeline stages, evaluations, training steps), and the sizes that
  follow from the model: weights, gradients and AdamW state in fp32, the engine's KV per token.
  With `--marks` the child runs under `scripts/bench/memory_marks.py`, which marks RSS where each
  part of the run starts and ends (rollouts, forward, backward, optimizer step, ...), and the
  peak of each part is printed per phase: what holds the memory, not only how much.
- **--update**: in this process, one policy update (`PolicyUpdater.update`) on a synthetic
  batch shaped like a `make demo` GRPO step (4 tasks x 4 episodes of one call: a 300-token
  system prompt, a 30-token question, 64 completion tokens; 1444 packed tokens, 1024 trained),
  repeated --steps times, with the RSS before, at the peak of and after each update (before and
  after `release_memory`). Overrides (`trainer.gradient_checkpointing=true`,
  `trainer.logits_chunk_tokens=0`, `trainer.optimizer_state_dtype=bfloat16`,
  `trainer.malloc_mmap_threshold_kb=0`, ...) measure one lever at a time in minutes.

Usage:
    .venv/bin/python -m scripts.bench.memory [--conf tutorial/example_math_agent/math_agent.yaml]
        [--marks] [--log run.log] [trainer.total_steps=2 trainer.val_every=0 ...]
    .venv/bin/python -m scripts.bench.memory --update [--steps 2] [trainer.logits_chunk_tokens=0 ...]

A benchmark measures; it asserts nothing. Other processes on the machine do not change RSS,
but they slow the run down. MALLOC_ARENA_MAX and other malloc settings in the environment
reach the child (and this process) unchanged.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scripts.bench.common import child_env
from scripts.bench.memory_marks import parse_mark

# Log lines that start a phase of the run, and the phase's name.
_PHASES = [
    (re.compile(r"pipeline: stage (\d+)/\d+ \((\w+)\)"), lambda m: f"stage {m[1]} {m[2]}"),
    (re.compile(r"eval (\S+): \d+ \S+ tasks"), lambda m: f"eval {m[1]}"),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default="tutorial/example_math_agent/math_agent.yaml")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples")
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    parser.add_argument("--log", type=Path, default=None, help="run mode: also write the run's output to this file")
    parser.add_argument("--exp-dir", type=Path, default=None,
                        help="run mode: the run's experiment root [default: a new temporary directory, so an "
                             "earlier `make demo` in experiments/ does not stop the run]")
    parser.add_argument("--marks", action="store_true",
                        help="run mode: RSS marks inside the run (scripts/bench/memory_marks.py): the peak of each part")
    parser.add_argument("--update", action="store_true", help="measure policy updates in this process")
    parser.add_argument("--steps", type=int, default=2, help="--update: updates to run")
    parser.add_argument("overrides", nargs="*", help="config overrides passed to ajet (key=value)")
    return parser.parse_args(argv)


def model_sizes(model_name: str = "smollm2-135m-instruct") -> dict[str, float]:
    """GB that follow from the model's shape (fp32): weights, grads + AdamW, KV per 1k tokens."""
    from transformers import AutoConfig

    from ajet.models.resolve import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(model_name))
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    inter, heads = config.intermediate_size, config.num_attention_heads
    kv_heads = config.num_key_value_heads
    dim = h // heads
    per_layer = h * (heads * dim) + 2 * h * (kv_heads * dim) + (heads * dim) * h + 3 * h * inter + 2 * h
    params = layers * per_layer + vocab * h + h  # tied embeddings
    gb = 4 / 1e9
    return {
        "weights_gb": params * gb,
        "grads_gb": params * gb,
        "adamw_gb": 2 * params * gb,
        "kv_per_1k_tokens_gb": 1000 * layers * 2 * kv_heads * dim * gb,
        "logits_per_1k_tokens_gb": 1000 * vocab * gb,
    }


def rss_of_tree(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    except psutil.NoSuchProcess:
        return 0


class Sampler:
    """RSS of a process tree every `interval` s in a thread; `peak_since(t)` for phases."""

    def __init__(self, pid: int, interval: float) -> None:
        self.pid, self.interval, self.start = pid, interval, time.monotonic()
        self.samples: list[tuple[float, int]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self.samples.append((time.monotonic() - self.start, rss_of_tree(self.pid)))
            time.sleep(self.interval)

    def now(self) -> float:
        return time.monotonic() - self.start

    def last(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def peak(self, since: float = 0.0, until: float = float("inf")) -> int:
        return max((rss for t, rss in self.samples if since <= t <= until), default=0)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_mode(args: argparse.Namespace) -> int:
    entry = ["-m", "scripts.bench.memory_marks" if args.marks else "ajet.cli.main"]
    exp_dir = args.exp_dir or Path(tempfile.mkdtemp(prefix="ajet_bench_memory_"))
    cmd = [sys.executable, *entry, "--conf", args.conf, "--backbone=debug", "--exp-dir", str(exp_dir),
           *args.overrides]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env({"PYTHONUNBUFFERED": "1"}))
    sampler = Sampler(proc.pid, args.interval)
    phases: list[tuple[float, str]] = [(0.0, "start-up")]
    steps: list[tuple[float, float, str]] = []
    marks: list[tuple[str, dict]] = []  # (phase, mark)
    assert proc.stdout is not None
    log = open(args.log, "w") if args.log else None  # noqa: SIM115 - closed below
    tail: collections.deque[str] = collections.deque(maxlen=15)  # shown if the run fails
    for line in proc.stdout:
        tail.append(line)
        if log:
            log.write(line)
        if mark := parse_mark(line):
            marks.append((phases[-1][1], mark))
            continue
        for pattern, name in _PHASES:
            if match := pattern.search(line):
                phases.append((sampler.now(), name(match)))
        if re.search(r"\bstep \d+/\d+", line):
            steps.append((round(sampler.now(), 1), round(sampler.last() / 1e9, 2), line.strip()[:90]))
    code = proc.wait()
    sampler.stop()
    if log:
        log.close()
    end = sampler.now()
    print(f"\nexit code {code}; {end:.0f} s; the run is in {exp_dir}")
    if code != 0:
        print("the run failed; the end of its output:\n" + "".join(tail))
    print("peak RSS per phase (GB):")
    rows = []
    for (t0, name), (t1, _) in zip(phases, [*phases[1:], (end, "")], strict=True):
        rows.append({"phase": name, "from_s": round(t0), "to_s": round(t1), "peak_gb": sampler.peak(t0, t1) / 1e9})
        print(f"  {name:28s} {t0:7.0f}-{t1:<7.0f} s  {rows[-1]['peak_gb']:6.2f}")
    print("RSS (GB) when a training step was logged:")
    for t, rss, line in steps[-20:]:
        print(f"  {t:7.1f} s {rss:6.2f}  {line}")
    if marks:
        print_marks(marks)
    peak = sampler.peak()
    sizes = model_sizes()
    print(f"\npeak RSS: {peak / 1e9:.2f} GB")
    print("from the model's shape (fp32): " + ", ".join(f"{k} {v:.2f}" for k, v in sizes.items()))
    if args.json:
        samples = sampler.samples[:: max(1, len(sampler.samples) // 500)]
        args.json.write_text(json.dumps({"peak_rss_gb": peak / 1e9, "exit_code": code, "sizes": sizes,
                                         "phases": rows, "samples": samples}, indent=1) + "\n")
    return code


def print_marks(marks: list[tuple[str, dict]]) -> None:
    """Per phase, the parts of the run (the interval after each kind of mark): peak RSS, RSS at
    its end, the engine's KV and prefix cache; largest peak first."""
    parts: dict[tuple[str, str], dict[str, float]] = {}
    for (_, before), (phase, after) in zip(marks, marks[1:], strict=False):
        part = parts.setdefault((phase, before["label"]), {"n": 0, "peak": 0.0, "end": 0.0, "kv": 0.0, "cache": 0.0})
        part["n"] += 1
        if after["peak"] >= part["peak"]:
            part["peak"], part["end"] = after["peak"], after["rss"]
        part["kv"], part["cache"] = max(part["kv"], after["kv"]), max(part["cache"], after["cache"])
    print("RSS marks (GB): the part of the run after each mark; peak, RSS at its end, engine KV / prefix cache:")
    for phase in dict.fromkeys(p for p, _ in parts):
        print(f"  {phase}")
        rows = sorted(((k[1], v) for k, v in parts.items() if k[0] == phase), key=lambda r: -r[1]["peak"])
        for label, v in rows[:8]:
            print(f"    after {label!r:26s} x{v['n']:<3.0f} peak {v['peak']:5.2f}  end {v['end']:5.2f}"
                  f"  kv {v['kv']:4.2f}  cache {v['cache']:4.2f}")


def demo_batch(vocab: int, seed: int = 0) -> list:
    """Samples shaped like a `make demo` GRPO step: 4 tasks x 4 one-call episodes."""
    import random

    from ajet.context.types import Sample

    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(300)]
    samples = []
    for task in range(4):
        question = [rng.randrange(vocab) for _ in range(30)]
        for episode in range(4):
            completion = [rng.randrange(vocab) for _ in range(64)]
            mask = [0] * (len(system) + len(question)) + [1] * len(completion)
            samples.append(Sample(
                input_ids=system + question + completion, loss_mask=mask,
                old_logprobs=[-3.0 * m for m in mask], advantage=[(1.0 if episode % 2 else -1.0) * m for m in mask],
                group_id=str(task), episode_id=f"{task}-{episode}", token_call_ids=[0 if m else -1 for m in mask]))
    return samples


def update_mode(args: argparse.Namespace) -> int:
    from ajet.config.loader import load_config
    from ajet.context.pack import loss_weights, pack_samples
    from ajet.rl.update import PolicyUpdater
    from ajet.training.memory import limit_heap_retention, release_memory
    from ajet.training.model import load_trainable_model
    from ajet.training.optim import build_optimizer

    cfg = load_config(args.conf, args.overrides, require_workflow=False)
    t = cfg.trainer
    limit_heap_retention(t.malloc_mmap_threshold_kb * 1024)  # as the training loop does
    print(f"gradient_checkpointing={t.gradient_checkpointing} logits_chunk_tokens={t.logits_chunk_tokens} "
          f"micro_batch_tokens={t.micro_batch_tokens} bf16={t.bf16} "
          f"optimizer_state_dtype={t.optimizer_state_dtype.value} "
          f"malloc_mmap_threshold_kb={t.malloc_mmap_threshold_kb} "
          f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', '-')}", flush=True)
    sampler = Sampler(os.getpid(), 0.01)
    rows: list[dict[str, float | str]] = []

    def row(name: str, since: float) -> None:
        rows.append({"phase": name, "rss_gb": sampler.last() / 1e9, "peak_gb": sampler.peak(since) / 1e9})
        print(f"  {name:34s} rss {rows[-1]['rss_gb']:5.2f}  peak {rows[-1]['peak_gb']:5.2f}", flush=True)

    since = sampler.now()
    model, _ = load_trainable_model(cfg.model, seed=0, gradient_checkpointing=t.gradient_checkpointing,
                                    keep_matmuls=t.checkpoint_keep_matmuls)
    for p in model.parameters():  # touch every weight page, as the engine's first forward does
        p.data.add_(0)
    time.sleep(0.05)
    row("model loaded", since)
    optimizer, _ = build_optimizer(model, t, seed=cfg.project.seed)
    updater = PolicyUpdater(model, optimizer, t, cfg.algorithm, temperature=1.0)
    samples = demo_batch(model.config.vocab_size)
    packed = pack_samples(samples, loss_weights(samples, cfg.context.loss_agg), t.micro_batch_tokens)
    print(f"packed tokens {[p.num_tokens for p in packed]}, trained {[p.num_entries for p in packed]}")
    for step in range(1, args.steps + 1):
        since = sampler.now()
        start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
        updater.update(packed)
        seconds, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(0.05)
        # CPU time split: page faults of fresh mappings (malloc_mmap_threshold_kb) show as system time
        user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
        faults = after.ru_minflt - before.ru_minflt
        print(f"  update {step}: {seconds:.0f} s, cpu user {user:.1f} s + system {system:.1f} s, "
              f"{faults / 1e3:.0f}k page faults", flush=True)
        row(f"update {step}: after", since)
        since = sampler.now()
        release_memory()
        time.sleep(0.05)
        row(f"update {step}: after release_memory", since)
    sampler.stop()
    sizes = model_sizes()
    print("from the model's shape (fp32): " + ", ".join(f"{k} {v:.2f}" for k, v in sizes.items()))
    if args.json:
        args.json.write_text(json.dumps({"config": {"gradient_checkpointing": t.gradient_checkpointing,
                                                    "logits_chunk_tokens": t.logits_chunk_tokens,
                                                    "optimizer_state_dtype": t.optimizer_state_dtype.value,
                                                    "malloc_mmap_threshold_kb": t.malloc_mmap_threshold_kb},
                                         "rows": rows, "sizes": sizes}, indent=1) + "\n")
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    return update_mode(args) if args.update else run_mode(args)


if __name__ == "__main__":
    from ajet.cli.allocator import use_jemalloc

    use_jemalloc()  # the allocator `ajet` runs on (AJET_ALLOCATOR=system: the C library's)
    sys.exit(main(sys.argv[1:]))
