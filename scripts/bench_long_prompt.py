"""How a huge prompt is handled: refused fast, and tokenised off the episodes' event loop.

    python scripts/bench_long_prompt.py [--mb 10] [--allowed-chars 400000]

1. A `--mb` MB question against the bundled model's window: seconds until ContextBudgetError
   (the character bound decides before anything is rendered or tokenised).
2. An `--allowed-chars` question under a window large enough to accept it: the call's
   seconds, and the longest gap between heartbeats of a 10 ms ticker on the same loop
   (how long the loop was blocked; before, the whole tokenisation ran on it).
Numbers only; nothing is asserted. The engine is a stub that answers at once.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.context.tracker import ContextTracker
from ajet.engine.base import Completion
from ajet.engine.chat import ChatFormat
from ajet.tuner.session import ContextBudgetError, EpisodeSession


class InstantEngine:
    async def generate(self, prompt_ids, params, **_):  # noqa: ANN001 - the engine protocol
        return [Completion(token_ids=[2], logprobs=[0.0], finish_reason="stop", policy_version=0)]


def session(chat: ChatFormat, window: int) -> EpisodeSession:
    context = ContextConfig(max_model_len=window, max_sample_tokens=window)
    tracker = ContextTracker(chat, None, context)
    return EpisodeSession("bench", InstantEngine(), chat, tracker, RolloutConfig(max_tokens=8),
                          context, None, window)


async def with_ticker(call) -> tuple[float, float]:  # noqa: ANN001
    """(seconds the call took, longest gap between 10 ms ticks meanwhile)."""
    gaps, done = [0.0], asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last - 0.01)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)  # the ticker runs before the call starts
    start = time.perf_counter()
    try:
        await call
    except ContextBudgetError:
        pass
    took = time.perf_counter() - start
    done.set()
    await ticker
    return took, max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=10)
    parser.add_argument("--allowed-chars", type=int, default=400_000)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from ajet.models.resolve import bundled_checkpoint

    chat = ChatFormat(AutoTokenizer.from_pretrained(bundled_checkpoint()))
    words = "the quick brown fox jumps over the lazy dog "
    huge = (words * int(args.mb * 1e6 / len(words) + 1))[: int(args.mb * 1e6)]
    refused = session(chat, 8192).chat("main", [{"role": "user", "content": huge}])
    took, gap = asyncio.run(with_ticker(refused))
    print(f"{args.mb:g} MB question, window 8192: ContextBudgetError after {took:.3f} s "
          f"(loop blocked at most {gap * 1000:.0f} ms)")
    allowed = (words * (args.allowed_chars // len(words) + 1))[: args.allowed_chars]
    accepted = session(chat, 10_000_000).chat("main", [{"role": "user", "content": allowed}])
    took, gap = asyncio.run(with_ticker(accepted))
    print(f"{args.allowed_chars} chars accepted and tokenised: {took:.2f} s; the loop was "
          f"blocked at most {gap * 1000:.0f} ms meanwhile")


if __name__ == "__main__":
    main()
