"""What the Tinker API costs: `ajet tinker` driven by the official SDK against the same work
done in-process (issue 72's speed targets).

One process holds an `ajet tinker` service (`TinkerServer`, on a free port) and a `tinker`
SDK client of it. Both measurements use the service's own model, trainer and engine:

- training: a `forward_backward` (cross_entropy) + `optim_step` (AdamW) pair of --datums datums
  of --tokens tokens at LoRA rank --rank. API: a training client's `forward_backward` and
  `optim_step`, until both results are back. In-process: `LoraTrainer.forward_backward` and
  `.optim_step` (ajet/tinker_service/trainer.py, what the service runs) called directly on an
  adapter of the same rank, alpha, targets and seed, on the same datums, with the same
  `AdamParams`, on a worker thread of its own as the service runs them (`--direct-thread own`:
  in a thread made for each pair, as ajet's recipes run trainer work, ajet/own_thread.py;
  `main`: in the main thread; the thread changes the figure: docs/log/2026-12-06_tinker_api.md).
  The two adapters start equal and take the same steps, so the losses printed
  side by side should agree: both paths did the same work. Target: API <= 1.15x in-process.
  The service-side time inside the trainer is timed too: what is left of an API pair is the
  wire, the queue and the SDK.
- sampling: c requests at once, for each c in --concurrency, of --max-tokens tokens each (greedy;
  chat prompts whose answers run past 64 tokens on the bundled model, as the service keeps the
  model's EOS; both sides generate the same tokens, counted). API: `SamplingClient.sample` of the base model, c futures
  in flight. In-process: c concurrent `LocalEngine.generate` calls on the same engine, as
  scripts/bench/engine.py drives it. Target: API >= 0.8x in-process tokens/s.

Each measurement is repeated --repeats times, API and in-process alternating (which one goes
first alternates too), after one warm-up of each; reported: the median and the range (min-max)
of each side and the median of the per-repeat ratios. The machine and its load average are
printed with the figures. A benchmark measures; it asserts nothing about speed.

    python -m scripts.bench.tinker_api [--model bundled] [--datums 4] [--tokens 64] [--rank 8]
        [--concurrency 1,8] [--max-tokens 64] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ajet.own_thread import in_own_thread
from scripts.bench.common import fmt, machine, print_table

KEY = "tml-bench-tinker-api"
DIRECT = "bench-in-process"  # the in-process adapter's name on the service's trainer
TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
        "All that glitters is not gold, and not all those who wander are lost. ")

# Questions the bundled model answers at length (greedy: 64 tokens or more before its EOS).
QUESTIONS = ["Summarise the plot of Romeo and Juliet.", "Describe a cat to someone who has never seen one.",
             "Why is the sky blue?", "Give me a tip for learning Python.", "Write a short story about a lighthouse keeper.",
             "Describe the water cycle.", "Explain what a computer network is.", "Tell me about the history of Rome.",
             "How do airplanes fly?", "Describe your ideal holiday in detail."]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bundled", help="a checkpoint dir or the bundled model's name")
    parser.add_argument("--datums", type=int, default=4, help="training: datums per forward_backward")
    parser.add_argument("--tokens", type=int, default=64, help="training: tokens per datum")
    parser.add_argument("--rank", type=int, default=8, help="training: LoRA rank")
    parser.add_argument("--concurrency", default="1,8",
                        help="sampling: comma-separated requests in flight ('': no sampling)")
    parser.add_argument("--max-tokens", type=int, default=64, help="sampling: tokens per request")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each side, interleaved")
    parser.add_argument("--direct-thread", choices=("worker", "own", "main"), default="worker",
                        help="training in-process: on one worker thread (as the service), a thread made for each "
                             "pair (ajet's recipes), or the main thread")
    parser.add_argument("--json", type=Path, help="write the figures and every run here")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------- the two sides
class Bench:
    """The service, an SDK client of it, and the same work on each side."""

    def __init__(self, model: str, state_dir: Path, rank: int) -> None:
        import tinker

        from ajet.tinker_service.server import ServerOptions, TinkerServer
        from ajet.tinker_service.trainer import LoraSpec

        self.server = TinkerServer(ServerOptions(model=model, state_dir=state_dir, port=0), KEY).setup().start()
        service = self.server.service
        assert service is not None
        self.service, self.trainer, self.engine = service, service.trainer, service.engine
        self.base_model = service.settings.base_model
        self.client = tinker.ServiceClient(base_url=self.server.base_url, api_key=KEY)
        self.training = self.client.create_lora_training_client(base_model=self.base_model, rank=rank, seed=0).result()
        self.sampling = self.client.create_sampling_client(base_model=self.base_model).result()
        # The in-process adapter: the API client's spec and seed, so it starts equal to it.
        with self.engine.paused():
            self.trainer.create(DIRECT, LoraSpec(rank, service.settings.lora_alpha), seed=0)
        self.in_trainer: list[float] = []  # seconds inside the trainer per API call, service side
        self._time_trainer_calls()

    def _time_trainer_calls(self) -> None:
        """Wrap the trainer's two methods (on this instance) to time the service's calls into them;
        the in-process side calls the unwrapped ones (`self.direct`), on its own worker thread."""
        self.direct_worker = ThreadPoolExecutor(1, thread_name_prefix="bench-in-process")
        self.direct = {name: getattr(self.trainer, name) for name in ("forward_backward", "optim_step")}
        for name, method in self.direct.items():

            def timed(*args: Any, _method: Callable[..., Any] = method) -> Any:
                start = time.perf_counter()
                try:
                    return _method(*args)
                finally:
                    self.in_trainer.append(time.perf_counter() - start)

            setattr(self.trainer, name, timed)

    def close(self) -> None:
        self.direct_worker.shutdown()
        self.client.close("success").result()
        self.server.stop()

    # ------------------------------------------------------------------ training
    def train_api(self, data: list[Any], adam: Any) -> tuple[float, float, float]:
        """(seconds for the pair, the loss, seconds spent inside the trainer on the service side)."""
        self.in_trainer.clear()
        start = time.perf_counter()
        backward = self.training.forward_backward(data, "cross_entropy")
        step = self.training.optim_step(adam)
        loss = backward.result().metrics["loss:sum"]
        step.result()
        return time.perf_counter() - start, loss, sum(self.in_trainer)

    def train_direct(self, request: Any, adam: dict[str, float], thread: str) -> tuple[float, float]:
        """(seconds for the pair, the loss): the trainer's own calls, no service around them, in a
        worker thread, a thread made for the pair or this one (`thread`: worker, own, main)."""
        def pair() -> tuple[float, float]:
            start = time.perf_counter()
            _, metrics = self.direct["forward_backward"](request)
            self.direct["optim_step"](DIRECT, adam)
            return time.perf_counter() - start, metrics["loss:sum"]

        if thread == "worker":
            return self.direct_worker.submit(pair).result()
        return in_own_thread(pair) if thread == "own" else pair()

    # ------------------------------------------------------------------ sampling
    def sample_api(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
        """(seconds, tokens generated) for the prompts sampled at once through the SDK."""
        from tinker import types

        params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
        start = time.perf_counter()
        futures = [self.sampling.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
        tokens = sum(len(f.result().sequences[0].tokens) for f in futures)
        return time.perf_counter() - start, tokens

    def sample_direct(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
        """(seconds, tokens generated) for the same prompts as concurrent `generate` calls."""
        from ajet.engine.base import INITIAL_MODEL, SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

        async def run() -> list[Any]:
            return await asyncio.gather(*(self.engine.generate(p, params, model=INITIAL_MODEL) for p in prompts))

        start = time.perf_counter()
        results = asyncio.run(run())
        return time.perf_counter() - start, sum(len(r[0].token_ids) for r in results)


def sampling_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """`count` chat prompts (QUESTIONS in turn, numbered once they repeat) as token ids."""
    from ajet.engine.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    questions = [QUESTIONS[i % len(QUESTIONS)] + (f" (#{i})" if i >= len(QUESTIONS) else "") for i in range(count)]
    return [chat.encode(chat.render([{"role": "user", "content": q}])) for q in questions]


def training_batch(tokenizer: Any, datums: int, tokens: int) -> tuple[list[Any], Any]:
    """The same datums as the SDK's `Datum`s and as the trainer's `ForwardBackwardIn`."""
    import numpy as np
    from tinker import types

    from ajet.tinker_service.wire import DatumIn, ForwardBackwardIn

    ids = tokenizer.encode(TEXT * (1 + tokens // 20))
    sdk, ours = [], []
    for i in range(datums):
        window = ids[i: i + tokens + 1]
        assert len(window) == tokens + 1, f"the text is too short for {tokens} tokens"
        sdk.append(types.Datum(model_input=types.ModelInput.from_ints(window[:-1]),
                               loss_fn_inputs={"target_tokens": window[1:], "weights": [1.0] * tokens}))
        ours.append(DatumIn(window[:-1], {"target_tokens": np.asarray(window[1:], dtype=np.int64),
                                          "weights": np.ones(tokens, dtype=np.float32)}))
    return sdk, ForwardBackwardIn(DIRECT, 0, "cross_entropy", {}, ours, forward_only=False)


# ---------------------------------------------------------------------- the runs
def interleaved(api: Callable[[], tuple[Any, ...]], direct: Callable[[], tuple[Any, ...]],
                repeats: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """One warm-up of each, then `repeats` runs of each, alternating which goes first."""
    api(), direct()
    api_runs, direct_runs = [], []
    for i in range(repeats):
        for side in ((api, direct) if i % 2 == 0 else (direct, api)):
            (api_runs if side is api else direct_runs).append(side())
    return api_runs, direct_runs


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_training(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    from tinker import types

    sdk, request = training_batch(bench.training.get_tokenizer(), args.datums, args.tokens)
    adam_params = types.AdamParams(learning_rate=1e-4)
    adam = {k: float(v) for k, v in adam_params.model_dump(exclude_none=True).items()}  # as the service reads it
    api, direct = interleaved(lambda: bench.train_api(sdk, adam_params),
                              lambda: bench.train_direct(request, adam, args.direct_thread), args.repeats)
    api_s, direct_s = [r[0] for r in api], [r[0] for r in direct]
    return {"api_s": spread(api_s), "in_process_s": spread(direct_s),
            "service_trainer_s": spread([r[2] for r in api]),
            "ratio": statistics.median(a / d for a, d in zip(api_s, direct_s, strict=True)),
            "losses": {"api": [r[1] for r in api], "in_process": [r[1] for r in direct]},
            "runs": {"api_s": api_s, "in_process_s": direct_s}}


def measure_sampling(bench: Bench, args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    prompts = sampling_prompts(bench.engine.tokenizer, concurrency)
    api, direct = interleaved(lambda: bench.sample_api(prompts, args.max_tokens),
                              lambda: bench.sample_direct(prompts, args.max_tokens), args.repeats)
    api_rate, direct_rate = [t / s for s, t in api], [t / s for s, t in direct]
    return {"api_tok_s": spread(api_rate), "in_process_tok_s": spread(direct_rate),
            "ratio": statistics.median(a / d for a, d in zip(api_rate, direct_rate, strict=True)),
            "tokens": {"api": [t for _, t in api], "in_process": [t for _, t in direct]},
            "runs": {"api_tok_s": api_rate, "in_process_tok_s": direct_rate}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    before = machine()["load_average"]
    with tempfile.TemporaryDirectory(prefix="ajet_bench_tinker_") as state:
        bench = Bench(args.model, Path(state), args.rank)
        try:
            training = measure_training(bench, args)
            sampling = {c: measure_sampling(bench, args, c) for c in (int(x) for x in args.concurrency.split(",") if x)}
        finally:
            bench.close()
    return {"machine": machine() | {"load_average_before": before}, "training": training, "sampling": sampling}


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    def cell(s: dict[str, float], digits: int) -> str:
        return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)}-{fmt(s['max'], digits)})"

    t = result["training"]
    print_table(f"forward_backward + optim_step: {args.datums} datums x {args.tokens} tokens, LoRA rank {args.rank}, "
                f"cross_entropy; seconds, median (min-max) of {args.repeats}",
                ["", "in-process", "API", "API in the trainer", "API / in-process", "target"],
                [["pair", cell(t["in_process_s"], 2), cell(t["api_s"], 2), cell(t["service_trainer_s"], 2),
                  f"{t['ratio']:.2f}x", "<= 1.15x"]], right=True)
    print(f"losses, API: {' '.join(f'{x:.3f}' for x in t['losses']['api'])}; "
          f"in-process: {' '.join(f'{x:.3f}' for x in t['losses']['in_process'])}")
    rows = [[str(c), cell(s["in_process_tok_s"], 1), cell(s["api_tok_s"], 1), f"{s['ratio']:.2f}x", ">= 0.8x",
             f"{statistics.median(s['tokens']['in_process']):.0f} / {statistics.median(s['tokens']['api']):.0f}"]
            for c, s in result["sampling"].items()]
    print_table(f"sampling: greedy, {args.max_tokens} tokens a request; tokens/s, median (min-max) of {args.repeats}",
                ["concurrency", "in-process", "API", "API / in-process", "target", "tokens (in-process / API)"],
                rows, right=True)
    m = result["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, {' '.join(m['avx'])}; load average before {m['load_average_before']}, after {m['load_average']}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    report(result, args)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **result}, indent=2))


if __name__ == "__main__":
    main()
