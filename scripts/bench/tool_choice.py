"""How often the bundled model gives a usable structured output: under the tool's JSON-schema
grammar, with only the forced tool-call start, and with neither.

Each episode asks the model one arithmetic question through the tuner with
`structured_model=Answer` (what AgentScope's ReActAgent does for structured output: a
`generate_structured_output` tool plus `tool_choice` naming it). Counted per episode:
`called`, the reply parsed as a call of that tool (arguments a JSON object), and `valid`, its
`response.metadata` validates as `Answer` (any integer; correctness is not scored).
Compared: `grammar` (ajet's default, `rollout.tool_call_grammar`: the call is decoded under the
tool's JSON schema, ajet/engine/grammar.py), `forced` (`tool_call_grammar=off`: only the
call's start is forced, `tool_choice_prefix`) and `unforced` (neither), how ajet behaved first.

Usage:
    .venv/bin/python -m scripts.bench.tool_choice [--episodes 32] [--max-tokens 48] [--json FILE]

A benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from unittest import mock

from pydantic import BaseModel, ValidationError

QUESTIONS = [f"What is {a} + {b}? Answer with the number." for a, b in
             [(2, 3), (17, 25), (40, 2), (9, 9), (12, 30), (7, 8), (100, 23), (5, 61)]]


class Answer(BaseModel):
    value: int


async def one(engine, chat, rollout, context, question: str, episode_id: str) -> tuple[bool, bool]:
    from ajet.context.tracker import ContextTracker
    from ajet.tuner import EpisodeSession, ModelTuner

    tracker = ContextTracker(chat, None, context)
    session = EpisodeSession(episode_id, engine, chat, tracker, rollout, context, None, 2048)
    tuner = ModelTuner(session)
    try:
        response = await tuner([{"role": "user", "content": question}], structured_model=Answer)
    finally:
        tuner.close()
    called = any(block.get("type") == "tool_use" and block.get("name") == "generate_structured_output"
                 for block in response.content)
    try:
        Answer.model_validate(response.metadata or {})
        return called, True
    except ValidationError:
        return called, False


async def run_mode(engine, chat, rollout, context, episodes: int) -> tuple[int, int, float]:
    start = time.monotonic()
    jobs = [one(engine, chat, rollout, context, QUESTIONS[i % len(QUESTIONS)], f"e{i}") for i in range(episodes)]
    results = await asyncio.gather(*jobs)
    return sum(c for c, _ in results), sum(v for _, v in results), time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from ajet.config.schema import ContextConfig, ModelConfig, RolloutConfig
    from ajet.engine.chat import ChatFormat
    from ajet.engine.local import LocalEngine
    from ajet.models.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(ModelConfig())
    engine = LocalEngine(model, tokenizer, max_batch_size=16, max_model_len=2048)
    chat = ChatFormat(tokenizer)
    rollout = RolloutConfig(temperature=1.0, max_tokens=args.max_tokens)
    prefix_only = RolloutConfig(temperature=1.0, max_tokens=args.max_tokens, tool_call_grammar="off")
    context = ContextConfig()
    rows = {}
    try:
        rows["grammar"] = asyncio.run(run_mode(engine, chat, rollout, context, args.episodes))
        rows["forced"] = asyncio.run(run_mode(engine, chat, prefix_only, context, args.episodes))
        with mock.patch("ajet.tuner.session.tool_choice_prefix", lambda *args, **kwargs: ""):
            rows["unforced"] = asyncio.run(run_mode(engine, chat, prefix_only, context, args.episodes))
    finally:
        engine.close()
    print(f"structured output on the bundled model: {args.episodes} episodes, temperature 1.0, "
          f"max {args.max_tokens} new tokens")
    print(f"{'mode':10} {'called':>8} {'valid':>8} {'time s':>7}")
    for mode, (called, valid, seconds) in rows.items():
        print(f"{mode:10} {called:>5}/{args.episodes:<2} {valid:>5}/{args.episodes:<2} {seconds:>7.1f}")
    if args.json:
        args.json.write_text(json.dumps({m: {"called": c, "valid": v, "episodes": args.episodes, "time_s": t}
                                         for m, (c, v, t) in rows.items()}, indent=2))


if __name__ == "__main__":
    main()
