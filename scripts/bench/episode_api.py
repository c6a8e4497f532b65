"""Episodes per minute through the episode API (`ajet serve`) against in-process workflows.

Same task (tutorial/example_remote_agent/remote_agent.yaml: the math agent's questions, one
call, math judge), same engine, same number of episodes in flight (`--concurrency`):

- in-process: `RolloutManager.rollout` running a `Workflow` that does what agent.py does
  (the OpenAI SDK on `tuner.openai_client()`), `--rounds` rollouts of `--groups` tasks × n;
- API: an `EpisodeBroker` on a gateway, `--concurrency` client processes running the tutorial's
  agent.py (Python) or agent.mjs (Node), `--rounds` batches taken with `next_batch`.

Only rollout is measured (no weight update between rounds). One warm-up round each (client
start-up, first prefill) is not timed. Completion lengths vary with sampling, so generated
tokens/s is printed too. Numbers on a busy shared machine are noisy: re-run on a quiet one.

    python -m scripts.bench.episode_api [--model PATH] [--clients python|node|both] [--concurrency 8]
        [--groups 4] [--n 4] [--rounds 3] [--max-tokens 48] [--max-staleness 1] [--json FILE]
    python -m scripts.bench.episode_api --model tiny     # a random 2-layer model: the API's own cost
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import REPO, child_env, tiny_model

EXAMPLE = REPO / "tutorial" / "example_remote_agent"


def build(args: argparse.Namespace) -> dict[str, Any]:
    from ajet.config import load_config
    from ajet.engine.local import LocalEngine
    from ajet.judge import build_judge
    from ajet.models.load import load_model_and_tokenizer
    from ajet.task_reader import build_reader
    from ajet.training.model import model_window

    cfg = load_config(EXAMPLE / "remote_agent.yaml", [
        f"model.path={args.model}", f"rollout.n={args.n}", f"rollout.max_tokens={args.max_tokens}",
        f"rollout.max_concurrency={args.concurrency}", f"trainer.batch_size={args.groups}",
        f"rollout.max_staleness={args.max_staleness}"], require_workflow=False)
    model, tokenizer = load_model_and_tokenizer(cfg.model)
    max_len = model_window(model, cfg.context.max_model_len)
    engine = LocalEngine(model, tokenizer, max_batch_size=args.concurrency, max_model_len=max_len)
    return {"cfg": cfg, "engine": engine, "tokenizer": tokenizer, "max_len": max_len,
            "reader": build_reader(cfg.task_reader, seed=0, env=cfg.env), "judge": build_judge(cfg.judge)}


def agent_workflow() -> Any:
    from ajet import Workflow, WorkflowOutput
    from tutorial.example_remote_agent.agent import SYSTEM_PROMPT

    class InProcessAgent(Workflow):
        """agent.py as a workflow: one call, the answer for the judge."""

        async def execute(self, task: Any, tuner: Any) -> Any:
            async with tuner.openai_client() as client:
                reply = await client.chat.completions.create(model="policy", messages=[
                    {"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.main_query}])
            return WorkflowOutput(reward=None, metadata={"final_answer": reply.choices[0].message.content or ""})

    return InProcessAgent()


def generated(episodes: list[Any]) -> int:
    return sum(end - start for e in episodes for tl in e.timelines for start, end in tl.completion_spans)


def in_process(parts: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    from ajet.rollout.engine_rollout import EngineRollout

    cfg = parts["cfg"]
    rollout = EngineRollout(cfg, parts["engine"], parts["tokenizer"], agent_workflow(),
                            model_max_len=parts["max_len"], judge=parts["judge"])
    try:
        rollout.event_loop.run_until_complete(rollout.manager.rollout(parts["reader"].next_batch(args.groups)))  # warm-up
        start, episodes = time.perf_counter(), []
        for _ in range(args.rounds):
            result = rollout.event_loop.run_until_complete(rollout.manager.rollout(parts["reader"].next_batch(args.groups)))
            episodes += result.episodes
        return summary("in-process", episodes, time.perf_counter() - start)
    finally:
        rollout.close()


def through_api(parts: dict[str, Any], args: argparse.Namespace, client: str) -> dict[str, float]:
    from ajet.rollout.engine_rollout import EngineRollout
    from ajet.serve.broker import EpisodeBroker, RemoteWorkflow
    from ajet.serve.http import attach_episode_api

    cfg, engine = parts["cfg"], parts["engine"]
    # the rollout's own gateway serves the episode API and its episodes' model calls
    rollout = EngineRollout(cfg, engine, parts["tokenizer"], RemoteWorkflow(), model_max_len=parts["max_len"],
                            judge=parts["judge"])
    gateway = rollout.gateway
    broker = EpisodeBroker(parts["reader"], parts["judge"], rollout, cfg.rollout, batch_size=args.groups,
                           total_steps=args.rounds + 1, policy_version=lambda: engine.policy_version,
                           max_staleness=args.max_staleness, client_reward=cfg.serve.client_reward)
    token = attach_episode_api(gateway, broker)
    env = child_env({"AJET_URL": gateway.base_url, "AJET_TOKEN": token})
    command = {"python": [sys.executable, str(EXAMPLE / "agent.py")], "node": ["node", str(EXAMPLE / "agent.mjs")]}
    procs = [subprocess.Popen(command[client], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(args.concurrency)]
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(broker.next_batch(1))  # warm-up: clients start, first prefill
        start, episodes = time.perf_counter(), []
        for step in range(2, args.rounds + 2):
            episodes += loop.run_until_complete(broker.next_batch(step)).episodes
        return summary(f"API, {args.concurrency} {client} clients", episodes, time.perf_counter() - start)
    finally:
        loop.close()
        broker.close()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        rollout.close()


def summary(name: str, episodes: list[Any], seconds: float) -> dict[str, Any]:
    ok = sum(e.status == "ok" for e in episodes)
    row = {"mode": name, "episodes": len(episodes), "ok": ok, "seconds": round(seconds, 2),
           "episodes_per_min": round(60 * len(episodes) / seconds, 1),
           "generated_tokens_per_s": round(generated(episodes) / seconds, 1)}
    print(f"{name:<28} {len(episodes):>4} episodes ({ok} ok) in {seconds:6.1f} s: "
          f"{row['episodes_per_min']:7.1f} episodes/min, {row['generated_tokens_per_s']:6.1f} generated tok/s",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="a checkpoint dir, the bundled model's name, or 'tiny' (a random 2-layer model)")
    parser.add_argument("--clients", choices=("python", "node", "both"), default="both")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.clients != "python" and not (EXAMPLE / "node_modules" / "openai").is_dir():
        sys.exit(f"the Node client needs its package: npm install --prefix {EXAMPLE.relative_to(REPO)}")
    if args.model == "tiny":
        import tempfile

        args.model = str(tiny_model(Path(tempfile.gettempdir()) / "ajet_bench_tiny_model"))
    parts = build(args)
    rows = [in_process(parts, args)]
    for client in (("python", "node") if args.clients == "both" else (args.clients,)):
        rows.append(through_api(parts, args, client))
    parts["engine"].close()
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
