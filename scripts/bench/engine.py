"""Benchmark the local engine: an agent workload (prefix cache on against off) and decode
throughput against Hugging Face `generate` (aggregate tokens/s), on the bundled model (fp32, CPU).

Agent workload (`--workloads agent`): --episodes concurrent episodes (--tasks tasks x the rest
as GRPO siblings) of a --turns-turn tool loop under one ~300-token system prompt. Each turn
generates --turn-tokens tokens (seeded sampling, EOS ignored, so both runs do the same work),
then a tool result is appended the way the context tracker extends a prompt (earlier prompt
+ completion ids + the new turn's tokens). Reported: episodes/min, prompt and prefilled
tokens, cache hit rate, with the engine's prefix cache off and on.

Decode (`--workloads decode`): for each concurrency c, c chat requests each generate exactly
--new-tokens tokens (greedy, EOS ignored):

- ours:          c concurrent `LocalEngine.generate` calls (continuous batching), fp32 weights
- ours_fp16 / ours_bf16 / ours_bf16_linear: the same with the engine's fp16 / bf16 / bf16-linear copy
                 (`--engine-dtypes`, ajet/engine/weights.py); after the timings each prints
                 its logprob mismatch against the fp32 weights on 16 sampled completions
- ours*_hf_step (with --hf-step): the same engines with their decode steps through the HF
                 forward instead of the written-out Llama step (ajet/engine/fused_decode.py)
- hf_sequential: `model.generate` once per request, one request after the other
- hf_batched:    one `model.generate` call over a static, left-padded batch of c
- llama_cpp:     llama.cpp's batched decoding of the c prompts in one context, on the GGUF the
                 model ships in (Q4_1: 4-bit weights; scripts/bench/llamacpp.py), the reference
                 for CPU inference; left out (with a note) when llama-cpp-python is not installed

Adapters (`--workloads adapters`, not run by default: it wraps a copy of the model in peft):
--adapter-requests concurrent requests (16), each generating --new-tokens tokens (greedy, EOS
ignored), on a model with --adapters LoRA adapters (4, r=8 on q/k/v/o, as `model.lora.per_role`
gives each role): "single", every request on one adapter, against "mixed", request i on adapter
i mod 4 in the same batch (peft's mixed-batch forward, ajet/engine/served_models.py). Same prompts.

Choices (`--workloads choices`, not run by default): --choice-requests concurrent requests
(16) under the calculator system prompt, each answering one structured choice the way
AgentScope's `structured_model` asks for it: a forced call of `generate_structured_output`
whose argument is one of 9 player names (temperature 1, seeded; the werewolves game's vote),
with the prefix cache on (--cache-tokens, as rollouts run), so the shared system prompt is
prefilled once.
Run with jump-forward on (the default: a forced run of tokens is forwarded in one go) and off
(one decode step per forced token), alternated --repeats times; answers/s and decode steps.

Usage:
    .venv/bin/python -m scripts.bench.engine [--json FILE] [--workloads agent,decode,adapters,choices]
        [--new-tokens 128] [--concurrency 1,4,16] [--episodes 16] [--turns 8]
        [--engine-dtypes float32,float16,bfloat16] [--repeats 2] [--adapters 4]
        [--cpu-isa native|avx512_bf16|avx512|avx2]

`--cpu-isa avx2|avx512|avx512_bf16` caps the instruction sets torch's kernels may use (ATen's
dispatch, oneDNN, MKL, FBGEMM: each has an environment variable for it; the script re-runs
itself with them set): on an AMX machine, `avx512_bf16` runs the kernels an AVX-512 CPU with
avx512_bf16 but no AMX would, `avx2` those of an AVX2-only CPU. It answers which kernels win on
which instruction set; the memory, caches and clocks are still this machine's, so it does not
stand in for a measurement on the other machine. llama.cpp (built for this CPU) is left out.

A benchmark measures; it asserts nothing about speed. The machine may be shared: repeat
runs and compare like with like.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from scripts.bench import llamacpp
from scripts.bench.common import CPU_ISA, chat_prompts


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
        default="ours,hf_sequential,hf_batched,llama_cpp",
        help="comma-separated subset of the four methods",
    )
    parser.add_argument(
        "--engine-dtypes",
        default="float32,float16,bfloat16,bfloat16_linear",
        help="decode: the engine weight dtypes measured as 'ours' (float32), ours_fp16, ours_bf16, "
             "ours_bf16_linear (bfloat16_linear: CPUs with avx512_bf16 or AMX)",
    )
    parser.add_argument(
        "--hf-step", action="store_true",
        help="decode: also measure each 'ours' engine with its decode steps through the HF forward "
             "(fused_decode=False; rows ours_hf_step, ours_fp16_hf_step, ...), to compare with the "
             "written-out Llama step (ajet/engine/fused_decode.py)",
    )
    parser.add_argument(
        "--cpu-isa", choices=sorted(CPU_ISA), default="native",
        help="cap the instruction sets torch's CPU kernels may use (see the module docstring)",
    )
    parser.add_argument("--workloads", default="agent,decode", help="agent and/or decode")
    parser.add_argument("--episodes", type=int, default=16, help="agent: concurrent episodes")
    parser.add_argument("--tasks", type=int, default=4, help="agent: distinct tasks (episodes / tasks per task)")
    parser.add_argument("--turns", type=int, default=8, help="agent: LLM calls per episode")
    parser.add_argument("--turn-tokens", type=int, default=32, help="agent: tokens generated per call")
    parser.add_argument(
        "--cache-tokens", type=int, default=16384, help="agent: prefix cache budget of the 'on' run"
    )
    parser.add_argument("--adapters", type=int, default=4, help="adapters: LoRA adapters in the mixed batch")
    parser.add_argument("--adapter-requests", type=int, default=16, help="adapters: concurrent requests")
    parser.add_argument("--choice-requests", type=int, default=16, help="choices: concurrent requests")
    return parser.parse_args(argv)


# A calculator agent's system prompt, ~300 tokens with the chat template (as tutorial's).
SYSTEM = (
    "You are a careful math assistant. Solve the user's arithmetic word problem step by step. "
    "You have one tool, `calculator`, which evaluates an arithmetic expression exactly. Always "
    "use it for any multiplication, division or sum with more than two terms: write the "
    "expression, read the result, then continue. Never guess a number you could compute. "
    "When you know the final answer, write it on the last line as `Answer: <number>` and stop.\n\n"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "calculator", "description": "Evaluate an '
    'arithmetic expression with + - * / and parentheses and return the exact result as a '
    'decimal number. Use it for every computation.", "parameters": {"type": "object", '
    '"properties": {"expression": {"type": "string", "description": "The expression, e.g. '
    '(12 + 7) * 3 / 4"}}, "required": ["expression"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
    "Examples of good behaviour: to find the cost of 7 pens at 3 dollars each and 2 books "
    "at 12 dollars each, call the calculator with 7 * 3 + 2 * 12, read 45, and answer 45. "
    "To split 96 apples among 8 children, call the calculator with 96 / 8, read 12, and "
    "answer 12. Keep every reply short."
)


def agent_prompts(tokenizer, tasks: int) -> list[list[int]]:
    """The first-turn prompt of each task."""
    from ajet.engine.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    firsts = [
        chat.encode(chat.render([
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"A shop sells {i + 3} boxes of {7 * i + 5} pencils. How many pencils?"},
        ]))
        for i in range(tasks)
    ]
    return firsts


def tool_turn(tokenizer, episode: int, turn: int) -> list[int]:
    """What the tracker appends after a completion: end of turn, the tool result, a new turn."""
    text = (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        f'{{"result": {episode * 37 + turn * 11}.0, "expression_ok": true}}\n'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    return tokenizer.encode(text, add_special_tokens=False)


def bench_agent(engine, tokenizer, args) -> dict[str, float]:
    """Run the episodes concurrently; return episodes/min and the engine's prefill counters."""
    from ajet.engine.base import SamplingParams

    firsts = agent_prompts(tokenizer, args.tasks)

    async def episode(e: int) -> int:
        prompt = firsts[e % args.tasks]
        calls = 0
        for turn in range(args.turns):
            params = SamplingParams(temperature=1.0, max_tokens=args.turn_tokens, seed=1000 * e + turn)
            (completion,) = await engine.generate(prompt, params)
            calls += 1
            prompt = prompt + completion.token_ids + tool_turn(tokenizer, e, turn)
        return calls

    async def run() -> list[int]:
        return await asyncio.gather(*(episode(e) for e in range(args.episodes)))

    engine.take_metrics()
    start, cpu_start = time.perf_counter(), time.process_time()
    asyncio.run(run())
    elapsed = time.perf_counter() - start
    # CPU seconds of this process (all threads): less disturbed by other jobs than wall time.
    cpu = time.process_time() - cpu_start
    out = {"episodes_per_min": args.episodes / elapsed * 60, "seconds": elapsed, "cpu_seconds": cpu}
    out.update({k.split("/")[1]: v for k, v in engine.take_metrics().items()})
    return out


def run_agent(model, tokenizer, args) -> dict[str, dict[str, float]]:
    """Cache off and on, alternated --repeats times (a fresh engine each run); the best run
    of each is reported, as it is the one least disturbed by other processes."""
    from ajet.engine.local import LocalEngine

    runs: dict[str, list[dict[str, float]]] = {"cache_off": [], "cache_on": []}
    for _ in range(args.repeats):
        for name, budget in (("cache_off", 0), ("cache_on", args.cache_tokens)):
            engine = LocalEngine(model, tokenizer, max_batch_size=max(32, args.episodes),
                                 eos_token_ids=[], prefix_cache_tokens=budget)
            try:
                bench_ours(engine, chat_prompts(tokenizer, 2), 4)  # warm-up (thread pools)
                engine.take_metrics()
                r = bench_agent(engine, tokenizer, args)
            finally:
                engine.close()
            runs[name].append(r)
            print(f"  {name:<9} {r['episodes_per_min']:7.2f} episodes/min  {r['seconds']:6.1f} s  "
                  f"cpu {r['cpu_seconds']:6.1f} s  "
                  f"prompt {int(r['prompt_tokens']):>6}  prefilled {int(r['prefilled_tokens']):>6}  "
                  f"hit rate {r['cache_hit_rate']:.2f}", flush=True)
    results = {name: max(rs, key=lambda r: r["episodes_per_min"]) for name, rs in runs.items()}
    off, on = results["cache_off"], results["cache_on"]
    print(f"\nagent workload (best of {args.repeats}): {args.episodes} episodes ({args.tasks} tasks) x "
          f"{args.turns} turns, {args.turn_tokens} new tokens a turn, "
          f"{len(agent_prompts(tokenizer, 1)[0])}-token first prompt")
    print(f"{'':>10} {'episodes/min':>13} {'cpu s':>8} {'prompt tok':>11} {'prefilled':>10} {'hit rate':>9}")
    for name, r in results.items():
        print(f"{name:>10} {r['episodes_per_min']:>13.2f} {r['cpu_seconds']:>8.1f} {int(r['prompt_tokens']):>11} "
              f"{int(r['prefilled_tokens']):>10} {r['cache_hit_rate']:>9.2f}")
    print(f"cache on / off: {on['episodes_per_min'] / off['episodes_per_min']:.2f}x episodes/min, "
          f"{off['cpu_seconds'] / on['cpu_seconds']:.2f}x less CPU time, "
          f"{off['prefilled_tokens'] / max(on['prefilled_tokens'], 1):.1f}x fewer prefilled tokens")
    return results | {"runs": runs}


def bench_ours(engine, prompts: list[list[int]], new_tokens: int, models: list | None = None) -> float:
    """Aggregate tokens/s of the prompts generated concurrently (`models[i]`: the engine's
    `model=` of request i; None: the policy)."""
    from ajet.engine.base import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    models = models or [None] * len(prompts)

    async def run():
        return await asyncio.gather(*(engine.generate(p, params, model=m) for p, m in zip(prompts, models, strict=True)))

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


def hf_rates(model, tokenizer, prompts: list[list[int]], levels: list[int], new_tokens: int,
             batched: bool) -> list[float]:
    """HF generate's tokens/s at each concurrency level, after one warm-up call."""
    bench_hf(model, tokenizer, prompts[:1], 8, batched=False)
    return [bench_hf(model, tokenizer, prompts[:c], new_tokens, batched) for c in levels]


OURS = {"float32": "ours", "float16": "ours_fp16", "bfloat16": "ours_bf16", "bfloat16_linear": "ours_bf16_linear"}
HF_STEP = "_hf_step"  # the same engine, its decode steps through the HF forward


ISA_MARK = "AJET_BENCH_CPU_ISA"  # set in the re-run process, so that it does not re-run again


def cap_cpu_isa(isa: str, argv: list[str]) -> None:
    """Re-run this script with `isa`'s caps in its environment (before torch is imported)."""
    if isa == "native" or os.environ.get(ISA_MARK) == isa:
        return
    env = os.environ | CPU_ISA[isa] | {ISA_MARK: isa}
    print(f"cpu-isa {isa}: re-running with " + " ".join(f"{k}={v}" for k, v in CPU_ISA[isa].items()), flush=True)
    os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *argv], env)  # this module, as -m runs it


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def decode_methods(args) -> list[str]:
    """--methods with "ours" expanded into one row per --engine-dtypes entry."""
    from ajet.engine.weights import has_bf16_gemm

    methods = []
    for method in (m for m in args.methods.split(",") if m):
        if method == "ours":
            for dtype in (d for d in args.engine_dtypes.split(",") if d):
                if dtype not in OURS:
                    raise SystemExit(f"unknown engine dtype {dtype!r}; choose from {', '.join(OURS)}")
                if dtype == "bfloat16_linear" and not has_bf16_gemm():
                    print("ours_bf16_linear: this CPU has no native bf16 GEMM (avx512_bf16 / AMX), "
                          "its column is left out", flush=True)
                    continue
                methods.append(OURS[dtype])
                if args.hf_step:
                    methods.append(OURS[dtype] + HF_STEP)
        elif method in ("hf_sequential", "hf_batched"):
            methods.append(method)
        elif method == "llama_cpp":
            if args.cpu_isa != "native":
                print(f"llama_cpp: built for this CPU, it ignores --cpu-isa {args.cpu_isa}; its column is left out",
                      flush=True)
            elif llamacpp.available():
                methods.append(method)
            else:
                print("llama_cpp: llama-cpp-python is not installed, its column is left out "
                      "(make bench installs it: llama.cpp builds from source, ~3.5 min on 2 cores with uv)", flush=True)
        else:
            raise SystemExit(f"unknown method {method!r}; choose from ours, hf_sequential, hf_batched, llama_cpp")
    return methods


def run_decode(model, tokenizer, args) -> dict[str, dict[str, float]]:
    import torch

    from ajet.engine.local import LocalEngine
    from ajet.engine.weights import fastest_engine_dtype
    from ajet.own_thread import in_own_thread

    levels = [int(c) for c in args.concurrency.split(",") if c]
    methods = decode_methods(args)
    prompts = chat_prompts(tokenizer, max(levels))
    runs: dict[str, dict[str, list[float]]] = {m: {str(c): [] for c in levels} for m in methods}
    dtypes = {name + suffix: dtype for dtype, name in OURS.items() for suffix in ("", HF_STEP)
              if name + suffix in methods}

    def engine(name: str) -> LocalEngine:
        return LocalEngine(model, tokenizer, max_batch_size=max(32, max(levels)), eos_token_ids=[], dtype=dtypes[name],
                           fused_decode=not name.endswith(HF_STEP))

    mismatch = {}
    if "llama_cpp" in methods:
        # In a process of its own (bench_isolated says why); a crash there leaves its column out.
        threads = args.threads or torch_threads()
        measured, why = llamacpp.bench_isolated(prompts, args.new_tokens, levels, args.repeats, threads)
        if measured is None:
            print(f"llama_cpp: {why}; its column is left out", flush=True)
            methods.remove("llama_cpp")
            del runs["llama_cpp"]
        else:
            runs["llama_cpp"].update(measured)
    # One method at a time, each in threads that end with it: every thread that runs torch keeps
    # an OpenMP pool, and with more pooled threads than cores libgomp stops spinning between
    # parallel regions (ajet/own_thread.py), which slowed the method measured after
    # another by 20-30 % on 2 cores. Each engine is built, warmed up, measured and closed in turn.
    for _ in range(args.repeats):
        for method in methods:
            if method == "llama_cpp":
                continue
            if method in dtypes:
                with engine(method) as eng:
                    # Warm-up: the first forwards on a new thread are slow (allocator, thread pools).
                    for c in sorted({1, max(levels)}):
                        bench_ours(eng, prompts[:c], 8)
                    rates = [bench_ours(eng, prompts[:c], args.new_tokens) for c in levels]
            else:
                rates = in_own_thread(hf_rates, model, tokenizer, prompts, levels, args.new_tokens,
                                          method == "hf_batched")
            for c, rate in zip(levels, rates, strict=True):
                runs[method][str(c)].append(round(rate, 2))
                print(f"  c={c:<3} {method:<14} {rate:8.1f} tok/s", flush=True)
    for name, dtype in dtypes.items():
        if dtype != "float32" and not name.endswith(HF_STEP):
            with engine(name) as eng:
                mismatch[name] = logprob_mismatch(eng, model, prompts, args.new_tokens)
    # On a shared machine the best run is the one least disturbed by other processes.
    results = {m: {c: max(rates) for c, rates in per_c.items()} for m, per_c in runs.items()}
    print(
        f"\ndecode: aggregate tokens/s (best of {args.repeats}), {args.new_tokens} new tokens per request"
    )
    print(f"{'concurrency':>12} " + " ".join(f"{m:>14}" for m in methods))
    for c in levels:
        print(f"{c:>12} " + " ".join(f"{results[m][str(c)]:>14.1f}" for m in methods))
    for base in ("hf_sequential", "hf_batched", "llama_cpp"):
        for ours in (m for m in methods if m in dtypes):
            if base in results:
                print(f"{ours} / {base}: " + ", ".join(
                    f"{results[ours][str(c)] / results[base][str(c)]:.2f}x at {c}" for c in levels))
    for name, m in mismatch.items():
        print(f"{name}: |engine - fp32 trainer| logprob over {m['tokens']} sampled tokens: "
              f"mean {m['mean']:.4f}, max {m['max']:.4f}")
    auto = fastest_engine_dtype(torch.device("cpu"))
    if OURS[auto] in results and "hf_batched" in results:
        top = str(max(levels))
        print(f"engine_dtype auto decodes with {auto} here: {results[OURS[auto]][top] / results['hf_batched'][top]:.2f}x "
              f"HF's static batch at {top} concurrent")
    return {"tok_s": results, "runs": runs, "logprob_mismatch": mismatch, "auto": auto}


def run_adapters(model, tokenizer, args) -> dict[str, dict[str, float]]:
    """--adapter-requests requests on one LoRA adapter, then spread over --adapters adapters in
    one batch; alternated --repeats times on one engine, best of each reported."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from ajet.engine.local import LocalEngine

    names = [f"role{i}" for i in range(args.adapters)]
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        task_type="CAUSAL_LM")
    peft = get_peft_model(copy.deepcopy(model), config, adapter_name=names[0])  # the others keep the plain model
    for name in names[1:]:
        peft.add_adapter(name, copy.deepcopy(config))
    with torch.no_grad():  # adapters that differ, as after training (peft starts lora_B at zero)
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    peft.eval()
    n = args.adapter_requests
    prompts = chat_prompts(tokenizer, n)
    plans = {"single": [None] * n, "mixed": [names[i % len(names)] for i in range(n)]}
    runs: dict[str, list[float]] = {name: [] for name in plans}
    with LocalEngine(peft, tokenizer, max_batch_size=max(32, n), eos_token_ids=[]) as engine:
        for models in plans.values():
            bench_ours(engine, prompts, 8, models)  # warm-up (thread pools)
        for _ in range(args.repeats):
            for name, models in plans.items():
                rate = bench_ours(engine, prompts, args.new_tokens, models)
                runs[name].append(round(rate, 2))
                print(f"  {name:<7} {rate:8.1f} tok/s", flush=True)
    best = {name: max(rates) for name, rates in runs.items()}
    print(f"\nadapters: {n} concurrent requests, {args.new_tokens} new tokens each (best of {args.repeats})")
    print(f"  one adapter          {best['single']:8.1f} tok/s")
    print(f"  {len(names)} adapters mixed     {best['mixed']:8.1f} tok/s")
    print(f"  mixed / single: {best['mixed'] / best['single']:.2f}x")
    return {"tok_s": best, "runs": runs, "ratio": best["mixed"] / best["single"]}


PLAYERS = ["Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan"]
CHOICE_TOOL = {"type": "function", "function": {
    "name": "generate_structured_output",
    "description": "Generate the required structured output with this function",
    "parameters": {"type": "object", "properties": {"choice": {"type": "string", "enum": PLAYERS}},
                   "required": ["choice"]}}}


def run_choices(model, tokenizer, args) -> dict[str, dict[str, float]]:
    """--choice-requests structured choices at once, jump-forward on against off."""
    from ajet.engine.base import SamplingParams
    from ajet.engine.chat import ChatFormat
    from ajet.engine.grammar import tool_call_grammar
    from ajet.engine.local import LocalEngine

    chat = ChatFormat(tokenizer)
    n = args.choice_requests
    prompts = [chat.encode(chat.render([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Day {i + 1}. The players alive are {', '.join(PLAYERS)}. "
                                    "Whom do you vote out? Answer with one name."}])) for i in range(n)]
    grammar = tool_call_grammar([CHOICE_TOOL], "generate_structured_output")

    def once(engine, seed: int) -> tuple[float, int, float]:
        async def run():
            return await asyncio.gather(*(engine.generate(p, SamplingParams(
                temperature=1.0, max_tokens=64, seed=seed + i, grammar=grammar)) for i, p in enumerate(prompts)))

        steps = engine.stats["decode_steps"]
        start = time.perf_counter()
        results = asyncio.run(run())
        elapsed = time.perf_counter() - start
        tokens = [len(r[0].token_ids) for r in results]
        return n / elapsed, engine.stats["decode_steps"] - steps, sum(tokens) / len(tokens)

    runs: dict[str, list[float]] = {"jump": [], "step": []}
    steps: dict[str, int] = {}
    tokens = 0.0
    engines = {name: LocalEngine(model, tokenizer, max_batch_size=max(32, n), jump_forward=(name == "jump"),
                                 prefix_cache_tokens=args.cache_tokens)  # as rollouts run it
               for name in runs}
    try:
        for engine in engines.values():
            once(engine, 10_000)  # warm-up (thread pools, the grammar's tokenizer)
        for repeat in range(args.repeats):
            for name, engine in engines.items():
                rate, steps[name], tokens = once(engine, repeat * n)
                runs[name].append(round(rate, 3))
                print(f"  {name:<5} {rate:7.2f} answers/s  {steps[name]} decode steps", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    best = {name: max(rates) for name, rates in runs.items()}
    print(f"\nchoices: {n} concurrent structured answers, {tokens:.1f} tokens each (best of {args.repeats})")
    print(f"  jump-forward on   {best['jump']:7.2f} answers/s  ({steps['jump']} decode steps)")
    print(f"  jump-forward off  {best['step']:7.2f} answers/s  ({steps['step']} decode steps)")
    print(f"  on / off: {best['jump'] / best['step']:.2f}x")
    return {"answers_s": best, "runs": runs, "decode_steps": steps, "tokens_per_answer": tokens,
            "ratio": best["jump"] / best["step"]}


def logprob_mismatch(engine, model, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """Sample one completion per prompt (temperature 1) with `engine`, then recompute each
    token's logprob with `model`'s fp32 weights, as the RL update does
    (`rollout/logprob_mismatch`)."""
    import torch

    from ajet.engine.base import SamplingParams

    async def run():
        return await asyncio.gather(*(
            engine.generate(p, SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=i))
            for i, p in enumerate(prompts)))

    diffs = []
    for prompt, (completion,) in zip(prompts, asyncio.run(run()), strict=True):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + completion.token_ids])).logits[0, len(prompt) - 1 : -1]
        trainer = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
        diffs.append((trainer - torch.tensor(completion.logprobs)).abs())
    d = torch.cat(diffs)
    return {"mean": float(d.mean()), "max": float(d.max()), "tokens": d.numel()}


def peak_rss_gb() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cap_cpu_isa(args.cpu_isa, argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ajet.models.resolve import resolve_model_path

    if args.threads:
        torch.set_num_threads(args.threads)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - {"agent", "decode", "adapters", "choices"}
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}; choose from agent, decode, adapters, choices")
    path = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    print(f"model={path.name} threads={torch.get_num_threads()} cpu-isa={args.cpu_isa} "
          f"(ATen: {torch.backends.cpu.get_cpu_capability()})", flush=True)
    payload: dict = {"model": str(path), "threads": torch.get_num_threads(), "time": time.time(),
                     "cpu_isa": args.cpu_isa}
    if "agent" in workloads:
        payload["agent"] = run_agent(model, tokenizer, args)
    if "decode" in workloads:
        payload["decode"] = run_decode(model, tokenizer, args) | {"new_tokens": args.new_tokens}
    if "adapters" in workloads:
        payload["adapters"] = run_adapters(model, tokenizer, args) | {"new_tokens": args.new_tokens}
    if "choices" in workloads:
        payload["choices"] = run_choices(model, tokenizer, args)
    payload["peak_rss_gb"] = round(peak_rss_gb(), 2)
    print(f"\npeak RSS of this benchmark process: {payload['peak_rss_gb']:.2f} GB")
    if args.json:
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
