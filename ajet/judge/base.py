"""The judge contract and the keys judges read.

A judge turns (task, output) into (reward, is_success). Built-in judges read
- the model's answer from `output.metadata["final_answer"]`, else `["answer"]`, else `["text"]`;
- the ground truth from `task.metadata["answer"]` (a value, or a list of accepted values).
A judge may also define `async acompute_reward(task, output)`; the rollout runner prefers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar, runtime_checkable

from ajet.errors import JudgeError
from ajet.workflow import WorkflowOutput, WorkflowTask

ANSWER_KEYS = ("final_answer", "answer", "text")
T = TypeVar("T")


@runtime_checkable
class Judge(Protocol):
    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        """(reward, is_success) for one episode."""
        ...


def answer_text(output: WorkflowOutput) -> str:
    """The model's answer: the first present of `output.metadata` final_answer / answer / text."""
    for key in ANSWER_KEYS:
        value = output.metadata.get(key)
        if value is not None:
            return value if isinstance(value, str) else str(value)
    return ""


def ground_truths(task: WorkflowTask) -> list[Any]:
    """`task.metadata["answer"]` as a list of accepted answers."""
    if "answer" not in task.metadata:
        raise JudgeError(
            f"task '{task.task_id}' has no metadata['answer'] to compare with; add an 'answer' "
            "field to the task data, or use a judge that needs none"
        )
    truth = task.metadata["answer"]
    return list(truth) if isinstance(truth, (list, tuple)) else [truth]


def run_sync(coro: Coroutine[Any, Any, T], judge_name: str) -> T:
    """Run an async judge from sync code (no event loop running in this thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise JudgeError(
        f"{judge_name}.compute_reward was called inside a running event loop; "
        f"use `await judge.acompute_reward(task, output)` there"
    )


async def ascore(judge: Any, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool | None]:
    """(reward, is_success) from any judge, preferring its `acompute_reward`."""
    if hasattr(judge, "acompute_reward"):
        reward, success = await judge.acompute_reward(task, output)
    else:
        reward, success = judge.compute_reward(task, output)
    return float(reward), success
