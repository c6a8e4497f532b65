"""A roofline for the training step: each phase's work, time, achieved rate and this machine's limit.

Phases, on the bundled model with a config's settings (the demo's by default):

- rollout decode and prefill: the local engine (`rollout.engine_dtype`), --concurrency chat
  prompts generating --new-tokens tokens each (greedy, EOS ignored), as scripts/bench/engine.py
  runs it. Prefill is timed as the generation of one token, decode as the rest.
- the SFT step (`ajet.sft.step.sft_step` on the config's SFT batches, as scripts/bench/sft_step.py
  builds them) and the GRPO update (`ajet.rl.update.PolicyUpdater.update` on the merged samples
  of one of scripts/bench/context.py's workloads): their forward (inside `Update.forward`),
  backward (`Tensor.backward`), clip + weight check and optimizer step (`optimizer.step`), timed
  around the real calls.

Work: FLOPs for the GEMM-bound phases, counted from the model's shapes and the step's token
counts (2 x weights x tokens through the decoder, 2 x head weights x rows through the LM head,
4 x query-key pairs x q width for attention; the backward 2x the forward, plus the forward that
activation checkpointing and the chunked LM head recompute). Bytes for decode (every matmul
weight once per step, and each row's KV so far) and the optimizer (parameters, gradients and
state, read and written). The limits are measured in the same run: GEMMs at the model's own
shapes and the phase's row counts in the phase's dtype, and memory bandwidth (the best of a
copy and a triad over arrays larger than the caches).

    python -m scripts.bench.roofline [--conf tutorial/example_math_agent/math_agent.yaml]
        [--steps 3] [--concurrency 16] [--new-tokens 64] [--json FILE] [--profile]

A benchmark measures; it asserts nothing about speed. On a shared machine read the load
average it prints beside the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts.bench.common import chat_prompts, machine, markdown_table, vector_flags

# ---------------------------------------------------------------------- counting (pure)


@dataclass(frozen=True)
class Shape:
    """The sizes of a Llama-style decoder that fix its FLOPs and bytes."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Shape:
        """From a transformers config (LlamaConfig and the like)."""
        heads = config.num_attention_heads
        return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers, heads,
                   getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, config.vocab_size)

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of one decoder layer's linear layers: q, k, v, o, gate, up, down."""
        q, kv, h, f = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]

    @property
    def layer_weights(self) -> int:
        return sum(i * o for i, o in self.linears())

    @property
    def head_weights(self) -> int:
        return self.hidden * self.vocab

    @property
    def matmul_weights(self) -> int:
        """Every weight a token's forward multiplies by (the embedding table once, as the LM head)."""
        return self.layers * self.layer_weights + self.head_weights

    def kv_bytes_per_token(self, element: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element


@dataclass(frozen=True)
class Tokens:
    """What a forward computes: `tokens` through the decoder layers, `head_rows` through the LM
    head, and `attended` query-key pairs (each token with itself and its ancestors)."""

    tokens: int
    head_rows: int
    attended: int

    @classmethod
    def packed(cls, seqs: Iterable[Any]) -> Tokens:
        """Tree-packed sequences: logits at the loss entries only; a token's ancestors are its depth."""
        seqs = list(seqs)
        return cls(sum(s.num_tokens for s in seqs), sum(s.num_entries for s in seqs),
                   sum(p + 1 for s in seqs for p in s.position_ids))

    @classmethod
    def prompts(cls, lengths: Sequence[int]) -> Tokens:
        """A prefill: causal attention over each prompt, logits at its last token only."""
        return cls(sum(lengths), len(lengths), sum(n * (n + 1) // 2 for n in lengths))

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.tokens + other.tokens, self.head_rows + other.head_rows, self.attended + other.attended)


def layer_flops(shape: Shape, t: Tokens) -> int:
    """The decoder layers' forward: their GEMMs, and attention's two products (QK^T, then x V)."""
    return 2 * shape.layers * shape.layer_weights * t.tokens + 4 * shape.layers * shape.heads * shape.head_dim * t.attended


def head_flops(shape: Shape, t: Tokens) -> int:
    return 2 * shape.head_weights * t.head_rows


def forward_flops(shape: Shape, t: Tokens) -> int:
    return layer_flops(shape, t) + head_flops(shape, t)


def backward_flops(shape: Shape, t: Tokens, *, recompute_layers: bool, recompute_head: bool,
                   kept_matmuls: bool = False) -> int:
    """The backward's executed FLOPs: twice the forward's (the gradients of the inputs and of the
    weights), plus the forward of what is recomputed (`trainer.gradient_checkpointing`: the
    decoder layers, of which only the down projection with `kept_matmuls`, i.e.
    `trainer.checkpoint_keep_matmuls` in fp32; `trainer.logits_chunk_tokens > 0`: the LM head's
    chunks)."""
    layers = 2 * shape.layers * shape.intermediate * shape.hidden * t.tokens if kept_matmuls else layer_flops(shape, t)
    return 2 * forward_flops(shape, t) + (layers if recompute_layers else 0) + (head_flops(shape, t) if recompute_head else 0)


def decode_bytes(shape: Shape, *, weight_element: int, kv_element: int, prompt_lengths: Sequence[int],
                 steps: int) -> int:
    """Bytes `steps` batched decode steps read: every matmul weight once a step, and each row's
    KV so far (at step s a row with a p-token prompt attends p + s tokens)."""
    contexts = sum(p * steps + steps * (steps + 1) // 2 for p in prompt_lengths)
    return shape.matmul_weights * weight_element * steps + shape.kv_bytes_per_token(kv_element) * contexts


def optimizer_bytes(tensors: Iterable[tuple[int, int, Sequence[int]]]) -> int:
    """Bytes an AdamW-style step moves, from (parameter bytes, gradient bytes, [state bytes]) per
    parameter: the parameter and its state read and written, the gradient read."""
    return sum(2 * p + g + 2 * sum(state) for p, g, state in tensors)


def clip_check_bytes(param_bytes: int, grad_bytes: int) -> int:
    """Clipping reads the gradients for their norm, then scales them in place (read + write);
    the weight check reads the weights once (`ajet.training.step.check_finite`)."""
    return 3 * grad_bytes + param_bytes


def state_tensors(optimizer: Any) -> list[tuple[int, int, list[int]]]:
    """`optimizer_bytes`' input from a torch optimizer after a step (scalar state such as the step
    count left out)."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = [s.numel() * s.element_size() for s in optimizer.state.get(p, {}).values()
                     if hasattr(s, "numel") and s.dim() > 0]
            out.append((p.numel() * p.element_size(), p.numel() * p.element_size(), state))
    return out


# ---------------------------------------------------------------------- the table


@dataclass
class Phase:
    """One row: `work` FLOPs (unit "FLOP") or bytes ("B") in `seconds`, against `limit` (per
    second, measured here: `limit_name` says how)."""

    name: str
    dtype: str
    work: float
    unit: str
    seconds: float
    limit: float | None
    limit_name: str

    @property
    def rate(self) -> float:
        return self.work / self.seconds if self.seconds > 0 else 0.0

    @property
    def share(self) -> float | None:
        return self.rate / self.limit if self.limit else None


def giga(value: float, unit: str) -> str:
    return f"{value / 1e9:.1f} G{unit}"


def roofline_table(phases: Sequence[Phase]) -> list[str]:
    """The markdown lines of the table: work, time, achieved rate, limit and share per phase."""
    rows = [[p.name, p.dtype, giga(p.work, p.unit), f"{p.seconds:.3f}", giga(p.rate, p.unit + "/s"),
             (giga(p.limit, p.unit + "/s") + f" ({p.limit_name})") if p.limit else "—",
             f"{100 * p.share:.0f} %" if p.share is not None else "—"] for p in phases]
    return markdown_table(["phase", "dtype", "work", "time, s", "achieved", "limit, measured here", "share"],
                          rows, right={2, 3, 4, 6})


# ---------------------------------------------------------------------- the limits

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def best_seconds(fn: Any, repeats: int) -> float:
    fn()  # warm-up: packing, the allocator
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_times(shape: Shape, t: Tokens, dtype: str, repeats: int = 5) -> dict[str, tuple[float, float]]:
    """(FLOPs, best seconds) of the whole model's GEMMs at `t`'s rows, in `dtype` ("fp32", "bf16"),
    by part: "layers forward", "head forward", "layers backward", "head backward", and "down
    forward" (the down projections alone: what a checkpointed layer recomputes with kept matmuls).
    One layer's GEMMs are timed and counted `shape.layers` times. The backward is the input gradient
    (g @ W) and the weight gradient (g^T @ x) of each linear layer, as autograd computes them."""
    import torch

    kind = getattr(torch, DTYPES[dtype])
    parts: dict[str, tuple[float, float]] = {}
    for part, pairs, rows, times in (("layers", shape.linears(), t.tokens, shape.layers),
                                     ("head", [(shape.hidden, shape.vocab)], t.head_rows, 1),
                                     ("down", shape.linears()[-1:], t.tokens, shape.layers)):
        xs = [torch.randn(rows, i, dtype=kind) for i, _ in pairs]
        ws = [torch.randn(o, i, dtype=kind) * 0.02 for i, o in pairs]
        gs = [torch.randn(rows, o, dtype=kind) for _, o in pairs]
        flops = 2 * rows * sum(i * o for i, o in pairs) * times

        def forward(xs: list = xs, ws: list = ws) -> None:
            for x, w in zip(xs, ws, strict=True):
                torch.nn.functional.linear(x, w)

        def backward(xs: list = xs, ws: list = ws, gs: list = gs) -> None:
            for x, w, g in zip(xs, ws, gs, strict=True):
                torch.mm(g, w)
                torch.mm(g.t(), x)

        parts[f"{part} forward"] = (flops, best_seconds(forward, repeats) * times)
        if part != "down":  # only its forward is recomputed; its backward is in the layers'
            parts[f"{part} backward"] = (2 * flops, best_seconds(backward, repeats) * times)
    return parts


def gemm_limit(times: dict[str, tuple[float, float]], parts: Sequence[str]) -> float:
    """FLOP/s of the GEMM mix `parts` (keys of `gemm_times`)."""
    return sum(times[p][0] for p in parts) / sum(times[p][1] for p in parts)


def bandwidth(mib: int = 512, repeats: int = 5) -> dict[str, float]:
    """Bytes/s of a copy (b -> a: read + write) and a triad (a = b + 2c: two reads, one write)
    over fp32 arrays of `mib` MiB each, larger than this machine's caches."""
    import torch

    n = mib * 2**20 // 4
    a, b, c = torch.zeros(n), torch.ones(n), torch.ones(n)
    copy = best_seconds(lambda: a.copy_(b), repeats)
    triad = best_seconds(lambda: torch.add(b, c, alpha=2.0, out=a), repeats)
    return {"copy": 2 * n * 4 / copy, "triad": 3 * n * 4 / triad}


# ---------------------------------------------------------------------- timing the real steps


class PhaseClock:
    """Seconds spent in each phase of `OptimizerStep` updates while `installed`: "forward"
    (inside `Update.forward`: the loss of one packed sequence), "backward" (`Tensor.backward`),
    "clip + check" (`Update.clip_gradients`, `Update.check_weights`) and "optimizer"
    (`optimizer.step`, through its step hooks). The real calls run; only timers are wrapped around them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._open: set[str] = set()

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        if phase in self._open:  # nested (a backward inside a backward): counted once, outermost
            yield
            return
        self._open.add(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start
            self.calls[phase] += 1
            self._open.discard(phase)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    @contextlib.contextmanager
    def installed(self, optimizer: Any) -> Iterator[PhaseClock]:
        from unittest import mock

        import torch

        from ajet.training.step import Update

        clock, forward, clip, check = self, Update.forward, Update.clip_gradients, Update.check_weights
        backward = torch.Tensor.backward

        @contextlib.contextmanager
        def timed_forward(update: Update, seq: Any) -> Iterator[None]:
            with clock.timing("forward"), forward(update, seq):
                yield

        def timed_backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            with clock.timing("backward"):
                backward(tensor, *args, **kwargs)

        def timed_clip(update: Update) -> bool:
            with clock.timing("clip + check"):
                return clip(update)

        def timed_check(update: Update) -> None:
            with clock.timing("clip + check"):
                check(update)

        starts: list[float] = []
        hooks = [optimizer.register_step_pre_hook(lambda *_: starts.append(time.perf_counter())),
                 optimizer.register_step_post_hook(lambda *_: clock._add("optimizer", starts.pop()))]
        try:
            with mock.patch.object(Update, "forward", timed_forward), \
                    mock.patch.object(Update, "clip_gradients", timed_clip), \
                    mock.patch.object(Update, "check_weights", timed_check), \
                    mock.patch.object(torch.Tensor, "backward", timed_backward):
                yield self
        finally:
            for hook in hooks:
                hook.remove()

    def _add(self, phase: str, start: float) -> None:
        self.seconds[phase] += time.perf_counter() - start
        self.calls[phase] += 1


@dataclass
class StepRun:
    """The timed steps of one recipe (after a warm-up step): what they forwarded, their wall
    time, the seconds of each phase, and the bytes of one optimizer step and one clip + check."""

    tokens: Tokens
    sequences: int
    steps: int
    seconds: float
    phases: dict[str, float]
    optimizer_bytes: int  # of one optimizer step
    clip_check_bytes: int  # of one clip + check
    optimizer_steps: int  # optimizer steps taken (steps x trainer.ppo_epochs)


def timed_steps(calls: Sequence[Any], packs: Sequence[Sequence[Any]], optimizer: Any, clock: PhaseClock,
                epochs: int = 1) -> StepRun:
    """Run `calls[0]` as a warm-up, then time the rest; `packs[i]` is call i's packed sequences
    (forwarded `epochs` times: `trainer.ppo_epochs`)."""
    with clock.installed(optimizer):
        calls[0]()
        clock.reset()
        start = time.perf_counter()
        for call in calls[1:]:
            call()
        seconds = time.perf_counter() - start
    tokens = Tokens(0, 0, 0)
    for packed in packs[1:]:
        tokens = tokens + Tokens.packed(packed)
    tokens = Tokens(tokens.tokens * epochs, tokens.head_rows * epochs, tokens.attended * epochs)
    state = state_tensors(optimizer)
    params = sum(p for p, _, _ in state)
    return StepRun(tokens, sum(len(p) for p in packs[1:]) * epochs, len(calls) - 1, seconds, dict(clock.seconds),
                   optimizer_bytes(state), clip_check_bytes(params, sum(g for _, g, _ in state)),
                   clock.calls["optimizer"])


def sft_run(recipe: Any, cfg: Any, steps: int) -> StepRun:
    """The config's first SFT steps through `sft_step`, in a thread of their own as the recipe runs them."""
    from ajet.context.pack import loss_weights, pack_samples
    from ajet.own_thread import in_own_thread
    from ajet.sft.step import sft_step

    pack_tokens = cfg.trainer.micro_batch_tokens if cfg.context.tree_packing else 0
    calls, packs = [], []
    for step in range(1, min(steps, len(recipe.schedule)) + 1):
        samples = [s for i in recipe.schedule[step - 1].indices for s in recipe.samples[i]]
        packs.append(pack_samples(samples, loss_weights(samples, cfg.context.loss_agg), pack_tokens))
        calls.append(lambda samples=samples, step=step: in_own_thread(
            sft_step, recipe.optimizer_step, samples, loss_agg=cfg.context.loss_agg, micro_batch_tokens=pack_tokens,
            logits_chunk=cfg.trainer.logits_chunk_tokens, step=step))
    return timed_steps(calls, packs, recipe.optimizer, PhaseClock())


def grpo_updater(model: Any, tokenizer: Any, cfg: Any, workload: str) -> tuple[Any, list[Any]]:
    """The RL recipe's updater over `model` (its own optimizer) and the packed sequences of
    `workload`'s merged samples (scripts/bench/context.py), every token trained."""
    from ajet.context.pack import loss_weights, pack_samples
    from ajet.rl.update import PolicyUpdater
    from ajet.training.optim import build_optimizer
    from scripts.bench.context import WORKLOADS, Renderer, samples_of

    _, merged, _ = samples_of(WORKLOADS[workload](Renderer(tokenizer), random.Random(0)))
    for s in merged:
        s.advantage = [0.5 * m for m in s.loss_mask]
    packed = pack_samples(merged, loss_weights(merged, cfg.context.loss_agg),
                          cfg.trainer.micro_batch_tokens if cfg.context.tree_packing else 0)
    optimizer, _ = build_optimizer(model, cfg.trainer, seed=cfg.project.seed)
    return PolicyUpdater(model, optimizer, cfg.trainer, cfg.algorithm, temperature=cfg.rollout.temperature), packed


def grpo_run(updater: Any, packed: list[Any], steps: int, epochs: int) -> StepRun:
    from ajet.own_thread import in_own_thread

    calls = [lambda step=step: in_own_thread(updater.update, packed, step=step) for step in range(1, steps + 1)]
    return timed_steps(calls, [packed] * steps, updater.optimizer, PhaseClock(), epochs)


def engine_run(model: Any, tokenizer: Any, dtype: str, concurrency: int, new_tokens: int,
               repeats: int) -> dict[str, Any]:
    """Prefill (generating one token) and decode (the other new_tokens - 1) of `concurrency`
    chat prompts at once on a LocalEngine; the best of `repeats` each."""
    from ajet.engine.base import SamplingParams
    from ajet.engine.local import LocalEngine

    prompts = chat_prompts(tokenizer, concurrency)
    with LocalEngine(model, tokenizer, max_batch_size=max(32, concurrency), eos_token_ids=[], dtype=dtype) as engine:
        def generate(tokens: int) -> float:
            params = SamplingParams(temperature=0.0, max_tokens=tokens)

            async def run() -> list[Any]:
                return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

            start = time.perf_counter()
            results = asyncio.run(run())
            elapsed = time.perf_counter() - start
            assert all(len(r[0].token_ids) == tokens for r in results), "the engine stopped early"
            return elapsed

        generate(4)  # warm-up: the engine thread's pools, the copy's packing
        firsts, wholes = [], []
        for _ in range(repeats):
            before = engine.stats["prefill_tokens"]
            firsts.append(generate(1))
            prefilled = engine.stats["prefill_tokens"] - before
            wholes.append(generate(new_tokens))
        resolved = engine.dtype
    prefill = min(firsts)
    return {"dtype": resolved, "prompt_lengths": [len(p) for p in prompts], "prefilled_tokens": prefilled,
            "prefill_s": prefill, "decode_s": min(wholes) - prefill, "decode_steps": new_tokens - 1}


# ---------------------------------------------------------------------- the phases


def engine_phases(shape: Shape, run: dict[str, Any], gemm: dict[str, tuple[float, float]],
                  memory: dict[str, float]) -> list[Phase]:
    """Decode against the memory bandwidth, prefill against the GEMMs at its rows."""
    dtype = run["dtype"]
    weight_element, kv_element = (4, 4) if dtype == "float32" else (2, 2 if dtype == "bfloat16" else 4)
    moved = decode_bytes(shape, weight_element=weight_element, kv_element=kv_element,
                         prompt_lengths=run["prompt_lengths"], steps=run["decode_steps"])
    best = max(memory, key=lambda k: memory[k])
    prompts = Tokens.prompts(run["prompt_lengths"])
    gemm_dtype = "bf16" if dtype in ("bfloat16", "bfloat16_linear") else "fp32"
    return [Phase("rollout decode", dtype, moved, "B", run["decode_s"], memory[best], f"memory, {best}"),
            Phase("prefill", dtype, forward_flops(shape, prompts), "FLOP", run["prefill_s"],
                  gemm_limit(gemm, ["layers forward", "head forward"]), f"GEMM {gemm_dtype}, {prompts.tokens} rows")]


def training_phases(label: str, shape: Shape, run: StepRun, gemm: dict[str, tuple[float, float]],
                    memory: dict[str, float], dtype: str, *, recompute_layers: bool, recompute_head: bool,
                    state: str, kept_matmuls: bool = False) -> list[Phase]:
    """Forward and backward against the GEMMs at the step's rows (the backward's mix includes
    the recomputed forward), clip + check and the optimizer step against the memory bandwidth,
    and the whole step: its forward + backward FLOPs over its wall time, against the GEMMs."""
    fwd = forward_flops(shape, run.tokens)
    bwd = backward_flops(shape, run.tokens, recompute_layers=recompute_layers, recompute_head=recompute_head,
                         kept_matmuls=kept_matmuls)
    fwd_parts = ["layers forward", "head forward"]
    recomputed = "down forward" if kept_matmuls else "layers forward"
    bwd_parts = (["layers backward", "head backward"] + ([recomputed] if recompute_layers else [])
                 + (["head forward"] if recompute_head else []))
    where = f"GEMM {dtype}, {run.tokens.tokens // max(run.sequences, 1)} rows"
    best = max(memory, key=lambda k: memory[k])
    steps = run.optimizer_steps
    return [
        Phase(f"{label} forward", dtype, fwd, "FLOP", run.phases.get("forward", 0.0), gemm_limit(gemm, fwd_parts), where),
        Phase(f"{label} backward", dtype, bwd, "FLOP", run.phases.get("backward", 0.0), gemm_limit(gemm, bwd_parts), where),
        Phase(f"{label} clip + check", "fp32", run.clip_check_bytes * steps, "B", run.phases.get("clip + check", 0.0),
              memory[best], f"memory, {best}"),
        Phase(f"{label} optimizer", state, run.optimizer_bytes * steps, "B", run.phases.get("optimizer", 0.0),
              memory[best], f"memory, {best}"),
        Phase(f"{label} whole step", dtype, fwd + bwd, "FLOP", run.seconds, gemm_limit(gemm, fwd_parts + bwd_parts), where),
    ]


# ---------------------------------------------------------------------- the run


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", default="tutorial/example_math_agent/math_agent.yaml")
    parser.add_argument("--steps", type=int, default=3, help="SFT steps and GRPO updates run (the first is a warm-up)")
    parser.add_argument("--workload", default="grpo-n8-shared-prompt",
                        help="the GRPO update's samples: a workload of scripts/bench/context.py")
    parser.add_argument("--engine-dtype", default="", help="the engine's weights (default: the config's rollout.engine_dtype)")
    parser.add_argument("--concurrency", type=int, default=16, help="prompts decoded at once")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per prompt (the demo's max_tokens)")
    parser.add_argument("--repeats", type=int, default=2, help="engine runs; the best is reported")
    parser.add_argument("--mib", type=int, default=512, help="size of each array of the bandwidth test")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    parser.add_argument("--profile", action="store_true", help="print the op table of one more SFT step and GRPO update")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, KEY=VALUE")
    return parser.parse_args(argv)


def measure(recipe: Any, cfg: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any, list[Any]]:
    """Every phase, then every limit, in this process: the table's rows and what they came from;
    the GRPO updater and its packed sequences (for `profile`)."""
    import torch

    from ajet.engine.weights import fastest_engine_dtype
    from ajet.own_thread import in_own_thread

    shape = Shape.of(recipe.model.config)
    dtype = "bf16" if recipe.optimizer_step.bf16 else "fp32"  # what the steps use (trainer.bf16 null: this machine's)
    engine_dtype = args.engine_dtype or getattr(cfg.rollout.engine_dtype, "value", cfg.rollout.engine_dtype)
    if engine_dtype == "auto":
        engine_dtype = fastest_engine_dtype(torch.device("cpu"))
    engine = engine_run(recipe.model, recipe.tokenizer, engine_dtype, args.concurrency, args.new_tokens, args.repeats)
    sft = sft_run(recipe, cfg, args.steps)
    updater, packed = grpo_updater(recipe.model, recipe.tokenizer, cfg, args.workload)
    grpo = grpo_run(updater, packed, args.steps, cfg.trainer.ppo_epochs)
    # The limits, each in a thread that ends with it (ajet/own_thread.py), as the steps ran.
    memory = in_own_thread(bandwidth, args.mib)

    def per_sequence(run: StepRun) -> Tokens:
        n = max(run.sequences, 1)
        return Tokens(run.tokens.tokens // n, run.tokens.head_rows // n, run.tokens.attended // n)

    prefill_dtype = "bf16" if engine["dtype"] in ("bfloat16", "bfloat16_linear") else "fp32"
    gemm = {"prefill": in_own_thread(gemm_times, shape, Tokens.prompts(engine["prompt_lengths"]), prefill_dtype),
            "sft": in_own_thread(gemm_times, shape, per_sequence(sft), dtype),
            "grpo": in_own_thread(gemm_times, shape, per_sequence(grpo), dtype)}
    recompute = {"recompute_layers": cfg.trainer.gradient_checkpointing,
                 "recompute_head": cfg.trainer.logits_chunk_tokens > 0,
                 # the recompute skips the kept fp32 matmuls and attention (ajet.training.model.KeepMatmuls)
                 "kept_matmuls": cfg.trainer.gradient_checkpointing and cfg.trainer.checkpoint_keep_matmuls
                 and dtype == "fp32"}
    state = "bf16 state" if cfg.trainer.optimizer_state_dtype == "bfloat16" else "fp32"
    phases = (engine_phases(shape, engine, gemm["prefill"], memory)
              + training_phases("SFT", shape, sft, gemm["sft"], memory, dtype, state=state, **recompute)
              + training_phases("GRPO", shape, grpo, gemm["grpo"], memory, dtype, state=state, **recompute))
    return ({"shape": asdict(shape), "engine": engine, "sft": asdict(sft), "grpo": asdict(grpo), "bandwidth": memory,
             "gemm": gemm, "recompute": recompute, "phases": phases}, updater, packed)


def profile(recipe: Any, cfg: Any, updater: Any, packed: list[Any]) -> None:
    """The op table of one more SFT step and one GRPO update (torch profiler, this thread)."""
    import torch

    from ajet.sft.step import sft_step

    samples = [s for i in recipe.schedule[0].indices for s in recipe.samples[i]]
    pack_tokens = cfg.trainer.micro_batch_tokens if cfg.context.tree_packing else 0
    runs = {"SFT step": lambda: sft_step(recipe.optimizer_step, samples, loss_agg=cfg.context.loss_agg,
                                         micro_batch_tokens=pack_tokens, logits_chunk=cfg.trainer.logits_chunk_tokens),
            "GRPO update": lambda: updater.update(packed)}
    for name, run in runs.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
        print(f"\n{name} under the profiler: {elapsed:.2f} s")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def recomputed(recompute: dict[str, bool]) -> str:
    """What the backward recomputes, in words."""
    parts = []
    if recompute["recompute_layers"]:
        parts.append("the layers' down projections and element-wise ops (the other matmuls and the attention kept)"
                     if recompute["kept_matmuls"] else "the decoder layers")
    if recompute["recompute_head"]:
        parts.append("the LM head's chunks")
    return ", ".join(parts) or "nothing"


def report(result: dict[str, Any], before: dict[str, Any], after: dict[str, Any], args: argparse.Namespace) -> None:
    import torch

    print(f"\nCPU: {before['cpu']}, {before['cores']} cores, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; flags: {' '.join(vector_flags())}")
    print(f"load average (1, 5, 15 min): {before['load_average']} at the start, {after['load_average']} at the end")
    e = result["engine"]
    print(f"{args.conf}: engine {e['dtype']}, {len(e['prompt_lengths'])} prompts of {min(e['prompt_lengths'])}-"
          f"{max(e['prompt_lengths'])} tokens, {args.new_tokens} new tokens each; timed after a warm-up: SFT steps "
          f"{result['sft']['steps']}, GRPO ({args.workload}) updates {result['grpo']['steps']}; recomputed in "
          f"the backward: {recomputed(result['recompute'])}\n")
    print(*roofline_table(result["phases"]), sep="\n")
    rows = {p.name: p for p in result["phases"]}
    for label in ("sft", "grpo"):
        run = result[label]
        forward, step = rows[f"{label.upper()} forward"], rows[f"{label.upper()} whole step"]
        model = 3 * forward.work / step.seconds  # forward + a backward of twice its FLOPs, nothing recomputed
        print(f"{label.upper()} step without the recomputed FLOPs (3 x the forward's): {model / 1e9:.1f} GFLOP/s, "
              f"{100 * model / step.limit:.0f} % of the GEMM limit" if step.limit else "")
        parts = ", ".join(f"{k} {v:.2f}" for k, v in run["phases"].items())
        rest = run["seconds"] - sum(run["phases"].values())
        print(f"{label.upper()}: {run['seconds'] / run['steps']:.2f} s a step; over {run['steps']} steps, s: {parts}, "
              f"the rest {rest:.2f}; {run['tokens']['tokens']} tokens, {run['tokens']['head_rows']} LM-head rows")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from ajet.config.loader import load_config
    from ajet.sft.recipe import SftRecipe
    from ajet.training.recipe import Closers

    before = machine()
    with tempfile.TemporaryDirectory() as exp_dir:
        cfg = load_config(args.conf, [f"project.exp_dir={exp_dir}", "logging.quiet=true", *args.overrides])
        recipe = SftRecipe(cfg)
        closers = Closers()
        try:
            recipe.setup(closers)
            result, updater, packed = measure(recipe, cfg, args)
            after = machine()
            report(result, before, after, args)
            if args.json:
                phases = [asdict(p) | {"rate": p.rate, "share": p.share} for p in result["phases"]]
                payload = result | {"phases": phases, "machine": before, "load_average_end": after["load_average"],
                                    "conf": args.conf, "time": time.time()}
                args.json.write_text(json.dumps(payload, indent=1) + "\n")
                print(f"wrote {args.json}")
            if args.profile:
                profile(recipe, cfg, updater, packed)
        finally:
            closers.close_all()
    return 0


if __name__ == "__main__":
    from ajet.cli.allocator import use_jemalloc

    use_jemalloc()  # the allocator `ajet` runs on (AJET_ALLOCATOR=system: the C library's)
    sys.exit(main(sys.argv[1:]))
