"""Peak resident memory (RSS) of a training run, e.g. the math agent of `make demo`, and
what the big parts of it are.

Runs `ajet --conf CONF --backbone=debug` (plus any overrides) as a child process, samples
its RSS every --interval seconds, and prints the peak, the RSS at each log line that names a
phase (rollout, update, validation), and the sizes that follow from the model: weights,
gradients and AdamW state (2 x weights) in fp32, and the engine's KV per token.

Usage:
    .venv/bin/python scripts/bench_memory.py [--conf tutorial/example_math_agent/math_agent.yaml]
        [-- trainer.total_steps=1 trainer.val_every=0]

A benchmark measures; it asserts nothing. Other processes on the machine do not change RSS,
but they slow the run down.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default="tutorial/example_math_agent/math_agent.yaml")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples")
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
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
        "grads_and_adamw_gb": 3 * params * gb,
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


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cmd = [sys.executable, "-m", "ajet.cli.main", "--conf", args.conf, "--backbone=debug", *args.overrides]
    print("running:", " ".join(cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic() - start, rss_of_tree(proc.pid)))
            time.sleep(args.interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    marks = []
    assert proc.stdout is not None
    for line in proc.stdout:
        rss = samples[-1][1] if samples else 0
        low = line.lower()
        if any(word in low for word in ("rollout", "update", "validation", "step")):
            marks.append((round(time.monotonic() - start, 1), round(rss / 1e9, 2), line.strip()[:100]))
    code = proc.wait()
    done.set()
    sampler.join()
    peak = max((rss for _, rss in samples), default=0)
    sizes = model_sizes()
    print(f"\nexit code {code}; {time.monotonic() - start:.0f} s")
    print("RSS (GB) when these lines were printed:")
    for t, rss, line in marks[-20:]:
        print(f"  {t:7.1f} s {rss:6.2f}  {line}")
    print(f"\npeak RSS: {peak / 1e9:.2f} GB")
    print("from the model's shape (fp32): " + ", ".join(f"{k} {v:.2f}" for k, v in sizes.items()))
    if args.json:
        args.json.write_text(json.dumps({"peak_rss_gb": peak / 1e9, "exit_code": code, "sizes": sizes,
                                         "samples": samples[:: max(1, len(samples) // 500)]}, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
