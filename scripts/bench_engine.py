"""Benchmark the local engine against Hugging Face `generate` (aggregate tokens/s).

For each concurrency c, c chat requests each generate exactly --new-tokens tokens (greedy,
EOS ignored) on the bundled model (fp32, CPU):

- ours:          c concurrent `LocalEngine.generate` calls (continuous batching)
- hf_sequential: `model.generate` once per request, one request after the other
- hf_batched:    one `model.generate` call over a static, left-padded batch of c

Usage:
    .venv/bin/python scripts/bench_engine.py [--json FILE] [--new-tokens 128] [--concurrency 1,4,16]

A benchmark measures; it asserts nothing about speed. The machine may be shared: repeat
runs and compare like with like.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

QUESTIONS = [
    "What is 2+3?",
    "Name the capital of France.",
    "Write a haiku about rain.",
    "Explain photosynthesis in one paragraph.",
    "List three prime numbers greater than 10.",
    "What is the boiling point of water at sea level?",
    "Summarise the plot of Romeo and Juliet.",
    "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Give me a tip for learning Python.",
    "What is 12 times 12?",
    "Describe a cat to someone who has never seen one.",
    "What does CPU stand for?",
    "Suggest a name for a bakery.",
    "What year did the first moon landing happen?",
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the results to this JSON file"
    )
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated request counts")
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="model path or the bundled name"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0 = torch's default)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure every (concurrency, method) this many times, interleaved; report the best",
    )
    parser.add_argument(
        "--methods",
        default="ours,hf_sequential,hf_batched",
        help="comma-separated subset of the three methods",
    )
    return parser.parse_args(argv)


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    from ajet.engine.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    questions = [
        QUESTIONS[i % len(QUESTIONS)] + (f" (#{i})" if i >= len(QUESTIONS) else "")
        for i in range(count)
    ]
    return [chat.encode(chat.render([{"role": "user", "content": q}])) for q in questions]


def bench_ours(engine, prompts: list[list[int]], new_tokens: int) -> float:
    from ajet.engine.base import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)

    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    start = time.perf_counter()
    results = asyncio.run(run())
    elapsed = time.perf_counter() - start
    produced = sum(len(r[0].token_ids) for r in results)
    assert produced == new_tokens * len(prompts), f"ours produced {produced} tokens"
    return produced / elapsed


def bench_hf(model, tokenizer, prompts: list[list[int]], new_tokens: int, batched: bool) -> float:
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = [prompts] if batched else [[p] for p in prompts]
    produced = 0
    start = time.perf_counter()
    for batch in batches:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        produced += (out.shape[1] - width) * len(batch)
    elapsed = time.perf_counter() - start
    assert produced == new_tokens * len(prompts), f"hf produced {produced} tokens"
    return produced / elapsed


def main(argv: list[str]) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ajet.engine.local import LocalEngine
    from ajet.models.resolve import resolve_model_path

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    methods = [m for m in args.methods.split(",") if m]
    path = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = chat_prompts(tokenizer, max(levels))
    runs: dict[str, dict[str, list[float]]] = {m: {str(c): [] for c in levels} for m in methods}
    print(
        f"model={path.name} new_tokens={args.new_tokens} threads={torch.get_num_threads()}",
        flush=True,
    )
    engine = LocalEngine(model, tokenizer, max_batch_size=max(32, max(levels)), eos_token_ids=[])
    try:
        # Warm-up: the first forwards on a new thread are slow (allocator, thread pools).
        for c in sorted({1, max(levels)}):
            bench_ours(engine, prompts[:c], 8)
        if set(methods) - {"ours"}:
            bench_hf(model, tokenizer, prompts[:1], 8, batched=False)
        for _ in range(args.repeats):
            for c in levels:
                for method in methods:
                    if method == "ours":
                        rate = bench_ours(engine, prompts[:c], args.new_tokens)
                    elif method in ("hf_sequential", "hf_batched"):
                        batched = method == "hf_batched"
                        rate = bench_hf(model, tokenizer, prompts[:c], args.new_tokens, batched)
                    else:
                        raise SystemExit(
                            f"unknown method {method!r}; choose from ours, hf_sequential, hf_batched"
                        )
                    runs[method][str(c)].append(round(rate, 2))
                    print(f"  c={c:<3} {method:<14} {rate:8.1f} tok/s", flush=True)
    finally:
        engine.close()
    # On a shared machine the best run is the one least disturbed by other processes.
    results = {m: {c: max(rates) for c, rates in per_c.items()} for m, per_c in runs.items()}

    print(
        f"\naggregate tokens/s (best of {args.repeats}), {args.new_tokens} new tokens per request"
    )
    print(f"{'concurrency':>12} " + " ".join(f"{m:>14}" for m in methods))
    for c in levels:
        print(f"{c:>12} " + " ".join(f"{results[m][str(c)]:>14.1f}" for m in methods))
    if "ours" in results and "hf_sequential" in results:
        for c in levels:
            print(
                f"ours / hf_sequential at {c}: {results['ours'][str(c)] / results['hf_sequential'][str(c)]:.2f}x"
            )
    if args.json:
        payload = {
            "tok_s": results,
            "runs": runs,
            "new_tokens": args.new_tokens,
            "threads": torch.get_num_threads(),
            "model": str(path),
            "time": time.time(),
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
