"""verifiers (https://github.com/PrimeIntellect-ai/verifiers, 0.4): a taskset by id, scored by its
tasks' own weighted `@vf.reward` functions.

verifiers pins packages that clash with ajet's, so the environment runs in its own virtual
environment (`make env-verifiers`: `.venv-verifiers`) behind `ajet/envs/verifiers_server.py`,
which the launcher starts (`env.verifiers.url` empty) or which a YAML joins by URL. This side
drives the episode: each model turn is a call of ajet's tuner (recorded token by token), its
reply goes to the server, which runs the tools it calls and answers with their results; a reply
without tool calls ends the episode (or `env.max_turns`). The reward is the task's score: the
weighted sum of its `@vf.reward` functions, each logged on its own (`workflow/reward_<name>`,
its unweighted score) with the task's `@vf.metric` values (`workflow/metric_<name>`).

A task is the k-th of the taskset (`env.id`, with `env.args` as its config) in its own order:
train the first `train_size`, then val and test the next ones; with `env.verifiers.eval_args`,
val and test come from the taskset under those arguments instead (e.g. `{split: test}`).
"""

from __future__ import annotations

import math
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from ajet.config.schema import EnvConfig
from ajet.env_protocol import CREATE, EVALUATE, LIST_TASKS, RELEASE, STEP
from ajet.envs.base import EnvError, Split
from ajet.envs.service import apost, assistant_message, episode_client, local_url, post
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

START_HINT = ("Build verifiers' environment with `make env-verifiers` and run with `ajet train` (its launcher "
              "starts the server), or start it yourself: .venv-verifiers/bin/python ajet/envs/verifiers_server.py "
              "--port PORT, and set env.verifiers.url")


class VerifiersTask(BaseModel):
    """`task.metadata["env"]`: which task of which taskset, on which server."""

    model_config = ConfigDict(extra="forbid")

    url: str
    id: str
    args: dict[str, Any]
    index: int
    limit: int
    max_turns: int
    timeout_s: float


def server_url(cfg: EnvConfig) -> str:
    return cfg.verifiers.url.rstrip("/") or local_url(cfg.verifiers.port)


def make_tasks(cfg: EnvConfig, splits: list[Split]) -> list[list[WorkflowTask]]:
    """train, val and test: consecutive runs of the taskset's tasks (or of its eval taskset's)."""
    url = server_url(cfg)
    eval_args = {**cfg.args, **cfg.verifiers.eval_args} if cfg.verifiers.eval_args else None
    sizes = {s.name: s.size for s in splits}
    starts = {"train": 0, "val": 0 if eval_args else sizes["train"],
              "test": sizes["val"] if eval_args else sizes["train"] + sizes["val"]}
    out: list[list[WorkflowTask]] = []
    for split in splits:
        args = cfg.args if split.name == "train" or eval_args is None else eval_args
        limit = starts[split.name] + split.size
        listed = post(url, LIST_TASKS, {"env_type": cfg.id, "split": split.name, "args": args, "limit": limit},
                      cfg.verifiers.timeout_s, START_HINT)
        rows = listed.get("tasks", [])[starts[split.name]:limit]
        out.append([_task(cfg, url, split.name, k, row, args, limit) for k, row in enumerate(rows)])
    return out


def _task(cfg: EnvConfig, url: str, split: str, k: int, row: dict[str, Any], args: dict[str, Any],
          limit: int) -> WorkflowTask:
    messages = row["messages"]
    spec = VerifiersTask(url=url, id=cfg.id, args=args, index=int(row["index"]), limit=limit,
                         max_turns=cfg.max_turns, timeout_s=cfg.verifiers.timeout_s)
    query = next((m["content"] for m in reversed(messages) if m["role"] == "user" and isinstance(m["content"], str)),
                 "")
    return WorkflowTask(task_id=f"{cfg.id}-{split}-{k}", main_query=query, init_messages=messages,
                        metadata={"env": spec.model_dump()}, env_type="verifiers")


class EnvWorkflow(Workflow):
    """The episode loop: the model's turn through the tuner, the environment's (tool results) from
    the server, until a reply calls no tool or `max_turns`; then the task's score."""

    name: str = "verifiers"

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        spec = VerifiersTask.model_validate(task.metadata["env"])
        body = {"env_type": spec.id, "args": spec.args, "index": spec.index, "limit": spec.limit,
                "task_id": task.task_id}
        async with episode_client(spec.timeout_s) as client:
            created = await apost(client, spec.url, CREATE, body)
            instance = {"instance_id": created.get("instance_id")}
            try:
                return await self._play(client, spec, created, instance, tuner)
            finally:
                await apost(client, spec.url, RELEASE, instance)

    async def _play(self, client: httpx.AsyncClient, spec: VerifiersTask, created: dict[str, Any],
                    instance: dict[str, Any], tuner: Any) -> WorkflowOutput:
        observation = created.get("observation") or {}
        messages, tools = list(observation.get("messages") or []), observation.get("tools") or None
        turns, tool_calls, done = 0, 0, False
        while turns < spec.max_turns and not done:
            reply = assistant_message(await tuner(messages, tools=tools))
            turns += 1
            tool_calls += len(reply.get("tool_calls", []))
            stepped = await apost(client, spec.url, STEP, {**instance, "action": reply})
            # The reply goes back exactly as received, so the next call extends this one (one sample).
            messages += [reply, *(stepped.get("observation") or {}).get("messages", [])]
            done = bool(stepped.get("done"))
        scored = await apost(client, spec.url, EVALUATE, instance)
        reward, breakdown = _score(spec.id, scored)
        return WorkflowOutput(
            reward=reward,
            metadata={"rewards": scored.get("rewards", {}), "final_answer": messages[-1].get("content", "")},
            log_metrics={"turns": float(turns), "tool_calls": float(tool_calls), "completed": float(done),
                         **breakdown},
        )


def _score(taskset: str, scored: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """The reward and its breakdown (each function's score, each metric), checked: a score that is no
    finite number fails the episode."""
    reward = scored.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise EnvError(f"verifiers taskset {taskset} scored {reward!r}: not a finite number")
    breakdown: dict[str, float] = {}
    for name, part in (scored.get("rewards") or {}).items():
        score = part.get("score") if isinstance(part, dict) else None
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise EnvError(f"verifiers taskset {taskset}'s reward {name} scored {score!r}: not a finite number")
        breakdown[f"reward_{name}"] = float(score)
    for name, value in (scored.get("metrics") or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            breakdown[f"metric_{name}"] = float(value)
    return float(reward), breakdown
