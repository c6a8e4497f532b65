"""Demonstrations for an SFT warm-up, played through an adapter's own workflow.

A scripted policy stands in for the model: it gets the messages of each call and the task, and
returns the reply as text (a reply that calls tools, for a verifiers toolset, is not scripted here). Each episode runs the adapter's unchanged `EnvWorkflow`, so a demonstration
holds exactly the messages the model sees during RL (the prompt, the observations as rendered,
the notes between turns). The last call's messages plus its reply are one SFT dialog
(docs/pipeline.md: every assistant turn in it is trained). An episode that does not succeed is
left out: a demonstration shows what to do.

    from ajet.envs.demos import write_demos
    write_demos(cfg.env, policy, "demos.jsonl", seeds_from=3_000_000, count=256)
    demos_for_yaml("my.yaml", policy, "demos.jsonl")   # the same, for a YAML whose SFT stage reads them

The demonstrations come from their own seed range (`seeds_from`; `demos_for_yaml`: the seeds
after test's), never from val or test; a demonstration whose first question is a val or test
question is skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from ajet.config.loader import load_config
from ajet.config.schema import SPLIT_SEED_STRIDE, AjetConfig, EnvConfig, EnvType
from ajet.envs.base import EnvError, Split, adapter, splits
from ajet.workflow import WorkflowTask

Policy = Callable[[list[dict[str, Any]], WorkflowTask], str | Awaitable[str]]


class ScriptedTuner:
    """Stands in for the tuner: the policy's text as the reply, every call's messages kept."""

    def __init__(self, policy: Policy, task: WorkflowTask) -> None:
        self.policy, self.task = policy, task
        self.calls: list[list[dict[str, Any]]] = []
        self.replies: list[str] = []

    async def __call__(self, messages: list[dict[str, Any]], **_: Any) -> Any:
        self.calls.append([dict(m) for m in messages])
        reply = self.policy(self.calls[-1], self.task)
        if not isinstance(reply, str):
            reply = await reply
        self.replies.append(reply)
        return SimpleNamespace(content=[{"type": "text", "text": reply}])


async def demo(cfg: EnvConfig, task: WorkflowTask, policy: Policy) -> dict[str, Any] | None:
    """One SFT dialog from playing `task` with `policy`, or None when the episode did not succeed."""
    tuner = ScriptedTuner(policy, task)
    # the adapters' workflows only call the tuner with the messages (and tools): the stand-in does that
    output = await adapter(EnvType(cfg.type)).EnvWorkflow().execute(task, cast(Any, tuner))
    if not output.is_success or not tuner.calls:
        return None
    return {"id": task.task_id, "task_type": f"{cfg.type.value}:{cfg.id}",
            "messages": [*tuner.calls[-1], {"role": "assistant", "content": tuner.replies[-1]}]}


def demo_tasks(cfg: EnvConfig, seeds_from: int, count: int) -> list[WorkflowTask]:
    """`count` tasks from the seed range `seeds_from`.. (a split of its own), leaving out a task whose
    question is a val or test question."""
    held = adapter(EnvType(cfg.type)).make_tasks(cfg, [s for s in splits(cfg) if s.name != "train"])
    held_out = {t.main_query for tasks in held for t in tasks}
    (tasks,) = adapter(EnvType(cfg.type)).make_tasks(cfg, [Split("demo", seeds_from, count)])
    return [t for t in tasks if t.main_query not in held_out]


def write_demos(cfg: EnvConfig, policy: Policy, out: str | Path, *, seeds_from: int, count: int) -> tuple[int, int]:
    """Play `count` demo tasks with `policy` and write the successful ones to `out` (JSONL, the SFT
    dialog format). Returns (written, played)."""
    tasks = demo_tasks(cfg, seeds_from, count)

    async def play() -> list[dict[str, Any] | None]:
        rows = []
        for task in tasks:
            try:
                rows.append(await demo(cfg, task, policy))
            except EnvError:
                rows.append(None)
        return rows

    rows = [r for r in asyncio.run(play()) if r is not None]
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows), len(tasks)


DEMO_SEEDS = 3 * SPLIT_SEED_STRIDE  # after train's, val's and test's (env.seed + 0, 1, 2 strides)


def yaml_without_sft(conf: str | Path) -> AjetConfig:
    """The config of a YAML whose SFT stage reads the demonstrations, without that stage (its file
    may not exist yet)."""
    return load_config(conf, ["pipeline.stages=[grpo]", "pipeline.overrides.sft=null"])


def demos_for_yaml(conf: str | Path, policy: Policy, out: str | Path, count: int = 256) -> tuple[int, int]:
    """`write_demos` for the environment of the YAML `conf`, from the seeds after its test split's."""
    env = yaml_without_sft(conf).env
    return write_demos(env, policy, out, seeds_from=env.seed + DEMO_SEEDS, count=count)
