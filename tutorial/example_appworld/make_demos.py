"""Regenerate demos.jsonl: demonstrations for the SFT warm-up (`appworld_warmup.yaml`), made on
tasks of the reference server's TRAIN split (kv-train-000 ...), never on val or test.

    python tutorial/example_appworld/make_demos.py

The base model answers almost every observation with text the environment cannot parse (8
action errors in 8 turns on val), so its rewards are the untouched store's and GRPO has no
signal. A scripted agent plays the model behind the unchanged `EnvServiceAgent` workflow,
against the real reference server (started here in a thread): it reads the goal sentence of
the first observation and acts on it step by step, one JSON action a turn, reading a value
with `get` before it copies or increases it, and ends with `done`. The dialog the workflow
sent on its last turn plus that reply is one SFT dialog (docs/pipeline.md): every reply in it
is trained, so the warm-up teaches the exact messages the agent sees during RL. A demo task
whose goal and start store equal a val or test task's is skipped. Deterministic.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ajet.task_reader.kv_env import KVTask, make_task

HERE = Path(__file__).parent
NUM_VAL, NUM_TEST = 8, 16  # appworld.yaml's num_val_tasks / num_test_tasks: the tasks demos avoid

_STEP = re.compile(
    r"Set `(?P<set>\w+)` to `(?P<value>[^`]*)`\."
    r"|Copy the value of `(?P<src>\w+)` into `(?P<dst>\w+)`\."
    r"|Delete `(?P<delete>\w+)`\."
    r"|Increase the number stored in `(?P<inc>\w+)` by (?P<by>\d+)\."
)


def plan(goal: str) -> list[dict[str, Any]]:
    """The actions for a goal sentence, in order; a "value" that is a callable is computed
    from the value the preceding `get` read."""
    actions: list[dict[str, Any]] = []
    for m in _STEP.finditer(goal):
        if m["set"]:
            actions.append({"action": "set", "key": m["set"], "value": m["value"]})
        elif m["src"]:
            actions += [{"action": "get", "key": m["src"]}, {"action": "set", "key": m["dst"], "value": str}]
        elif m["delete"]:
            actions.append({"action": "delete", "key": m["delete"]})
        else:
            by = int(m["by"])
            actions += [{"action": "get", "key": m["inc"]},
                        {"action": "set", "key": m["inc"], "value": lambda v, by=by: str(int(v) + by)}]
    if not actions:
        raise ValueError(f"no step understood in the goal {goal!r}")
    return [*actions, {"action": "done"}]


class ScriptedTuner:
    """Stands in for the tuner: answers each turn with the plan's next action."""

    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.replies: list[str] = []  # the reply to each call
        self.actions: list[dict[str, Any]] | None = None

    async def __call__(self, messages: list[dict[str, Any]]) -> Any:
        self.calls.append([dict(m) for m in messages])
        if self.actions is None:
            goal = re.search(r"Goal: (.*)", messages[1]["content"])
            self.actions = plan(goal.group(1) if goal else "")
        action = dict(self.actions.pop(0))
        if callable(action.get("value")):  # the value the last `get` read: "key = value"
            read = re.fullmatch(r"\S+ = (.*)", messages[-1]["content"].strip())
            if read is None:
                raise ValueError(f"expected a value read by 'get', got {messages[-1]['content']!r}")
            action["value"] = action["value"](read.group(1))
        self.replies.append(json.dumps(action))
        return SimpleNamespace(content=[{"type": "text", "text": self.replies[-1]}])


async def demo(task_id: str, base_url: str) -> dict:
    """One SFT dialog: the scripted agent doing `task_id` through the real workflow."""
    from env_agent import EnvServiceAgent

    from ajet import WorkflowTask

    tuner = ScriptedTuner()
    output = await EnvServiceAgent().execute(
        WorkflowTask(task_id=task_id, env_type="kv_store", metadata={"env_base_url": base_url, "split": "train"}),
        tuner)
    if not output.is_success:
        raise ValueError(f"{task_id}: the scripted agent did not reach the goal ({output.metadata})")
    return {"id": f"appworld-{task_id}", "task_type": "kv_store",
            "messages": [*tuner.calls[-1], {"role": "assistant", "content": tuner.replies[-1]}]}


def task_key(task: KVTask) -> tuple[str, tuple]:
    """What makes two tasks the same chore: the goal sentence and the start store."""
    return task.instruction, tuple(sorted(task.initial.items()))


def held_out() -> set[tuple[str, tuple]]:
    """`task_key` of every val and test task: a demo task equal to one is skipped."""
    return {task_key(make_task(split, i)) for split, n in (("val", NUM_VAL), ("test", NUM_TEST)) for i in range(n)}


def demo_task_ids(count: int) -> list[str]:
    """The first `count` train tasks whose goal and start store no val or test task has."""
    avoid = held_out()
    ids, index = [], 0
    while len(ids) < count:
        task = make_task("train", index)
        if task_key(task) not in avoid:
            ids.append(task.task_id)
        index += 1
    return ids


def make(count: int) -> list[dict]:
    ids = demo_task_ids(count)
    from ajet.task_reader.env_server import create_app, serve_in_thread

    app = create_app(num_train=int(ids[-1].rsplit("-", 1)[1]) + 1, num_val=NUM_VAL, num_test=NUM_TEST)
    with serve_in_thread(app) as url:
        return [asyncio.run(demo(task_id, url)) for task_id in ids]


def main(out_dir: Path = HERE, count: int = 256) -> Path:
    import sys

    sys.path.insert(0, str(HERE))
    out = out_dir / "demos.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in make(count)))
    return out


if __name__ == "__main__":
    print(main())
