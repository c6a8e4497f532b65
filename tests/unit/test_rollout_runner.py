"""TaskRunner: every way an episode ends, retries only for infrastructure errors, handles closed."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from ajet.config.schema import RolloutConfig
from ajet.errors import InfrastructureError
from ajet.rollout.runner import TaskRunner
from ajet.rollout.workflow_loader import FunctionWorkflow
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

# ------------------------------------------------------------------ fakes


@dataclass
class FakeTracker:
    calls: list[str] = field(default_factory=list)

    def timelines(self) -> list[str]:
        return [f"timeline-of-{c}" for c in self.calls]

    def stats(self) -> dict[str, int]:
        return {"calls": len(self.calls)}


class FakeTuner:
    """Records calls in the tracker; `fail` decides per attempt whether a call raises."""

    def __init__(self, tracker: FakeTracker, fail: BaseException | None) -> None:
        self.tracker = tracker
        self.fail = fail
        self.closed = False

    async def chat(self, text: str) -> str:
        if self.closed:
            raise InfrastructureError("session closed")
        if self.fail is not None:
            raise self.fail
        self.tracker.calls.append(text)
        return text.upper()


@dataclass
class FakeHandle:
    tuner: FakeTuner
    tracker: FakeTracker
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        self.tuner.closed = True


class FakeFactory:
    """`failures[i]` is raised by the tuner of the i-th opened handle (None = works)."""

    def __init__(
        self,
        failures: list[BaseException | None] | None = None,
        open_error: Callable[[int], BaseException | None] | None = None,
    ) -> None:
        self.failures = failures or []
        self.open_error = open_error
        self.handles: list[FakeHandle] = []
        self.opened_ids: list[str] = []
        self.open_attempts = 0

    def open_episode(self, episode_id: str, task: WorkflowTask) -> FakeHandle:
        self.open_attempts += 1
        if self.open_error is not None:
            err = self.open_error(self.open_attempts)
            if err is not None:
                raise err
        i = len(self.handles)
        tracker = FakeTracker()
        fail = self.failures[i] if i < len(self.failures) else None
        handle = FakeHandle(FakeTuner(tracker, fail), tracker)
        self.handles.append(handle)
        self.opened_ids.append(episode_id)
        return handle


class ChatWorkflow(Workflow):
    """Two model calls, then `result` (a reward, an exception to raise, or anything to return)."""

    result: Any = 1.0

    async def execute(self, task: WorkflowTask, tuner: Any) -> Any:
        await tuner.chat(task.main_query)
        await tuner.chat("again")
        if isinstance(self.result, BaseException):
            raise self.result
        if isinstance(self.result, float) or self.result is None:
            return WorkflowOutput(reward=self.result)
        return self.result


class SleepyWorkflow(Workflow):
    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        await asyncio.sleep(30)
        return WorkflowOutput(reward=1.0)


class SyncJudge:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        self.seen.append((task.task_id, output.metadata.get("answer")))
        return (
            (0.75, True)
            if output.metadata.get("answer") == task.metadata["answer"]
            else (0.0, False)
        )


class AsyncJudge(SyncJudge):
    def __init__(self) -> None:
        super().__init__()
        self.async_calls = 0

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        raise AssertionError("the runner must prefer acompute_reward")

    async def acompute_reward(
        self, task: WorkflowTask, output: WorkflowOutput
    ) -> tuple[float, bool]:
        self.async_calls += 1
        await asyncio.sleep(0)
        return 0.25, False


def config(**kw: Any) -> RolloutConfig:
    base = {"episode_timeout_s": 5.0, "max_retries": 2, "max_concurrency": 4}
    base.update(kw)
    return RolloutConfig(**base)


TASK = WorkflowTask(task_id="t1", main_query="hello", metadata={"answer": "42"})


def run_one(workflow: Workflow, factory: FakeFactory | None = None, judge: Any = None, **cfg: Any):
    factory = factory or FakeFactory()
    runner = TaskRunner(workflow, judge, factory, config(**cfg), backoff_s=0.001)
    try:
        episode = asyncio.run(runner.run_episode(TASK, "t1-e0", "t1"))
    finally:
        runner.close()
    return episode, factory


# ------------------------------------------------------------------ endings


def test_ok_episode_collects_tracker_and_closes_the_handle() -> None:
    ep, factory = run_one(ChatWorkflow(result=1.0))
    assert (ep.status, ep.reason, ep.reward, ep.is_success) == ("ok", "", 1.0, True)
    assert ep.num_calls == 2 and ep.timelines == ["timeline-of-hello", "timeline-of-again"]
    assert ep.tracker_stats == {"calls": 2}
    assert ep.episode_id == "t1-e0" and ep.group_id == "t1" and ep.retries == 0
    assert ep.duration_s > 0 and isinstance(ep.output, WorkflowOutput)
    assert [h.closed for h in factory.handles] == [True]


def test_zero_reward_without_verdict_is_not_a_success() -> None:
    ep, _ = run_one(ChatWorkflow(result=0.0))
    assert ep.status == "ok" and ep.is_success is False


def test_workflow_error_is_a_failed_episode_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ajet.rollout"):
        ep, factory = run_one(ChatWorkflow(result=KeyError("missing tool")))
    assert ep.status == "failed" and ep.reason == "workflow_error:KeyError"
    assert "missing tool" in ep.error_message and "Traceback" in ep.error_message
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "t1" in warnings[0].getMessage()
    assert factory.open_attempts == 1  # a workflow's own error is not retried
    assert factory.handles[0].closed
    assert ep.num_calls == 2 and ep.timelines == []  # calls counted, nothing to train on


def test_timeout_marks_the_episode_and_closes_the_handle() -> None:
    ep, factory = run_one(SleepyWorkflow(), episode_timeout_s=0.05)
    assert ep.status == "timeout" and ep.reason == "timeout"
    assert factory.handles[0].closed and factory.open_attempts == 1


def test_a_workflows_own_timeout_error_is_not_the_episode_timeout() -> None:
    ep, _ = run_one(ChatWorkflow(result=TimeoutError("tool timed out")))
    assert ep.status == "failed" and ep.reason == "workflow_error:TimeoutError"


def test_output_that_is_not_a_workflow_output() -> None:
    ep, _ = run_one(ChatWorkflow(result={"reward": 1.0}))
    assert ep.status == "failed" and ep.reason == "bad_output"
    assert "dict" in ep.error_message and "WorkflowOutput" in ep.error_message


def test_function_workflow_returning_none_is_bad_output() -> None:
    async def solve(task: dict, model) -> float:  # noqa: ANN001
        await model.chat(task["main_query"])

    ep, _ = run_one(FunctionWorkflow(solve))
    assert ep.status == "failed" and ep.reason == "bad_output"
    assert "returned NoneType" in ep.error_message


def test_function_workflow_reward() -> None:
    async def solve(task: dict, model) -> float:  # noqa: ANN001
        reply = await model.chat(task["main_query"])
        return 1.0 if reply == "HELLO" and task["answer"] == "42" else 0.0

    ep, _ = run_one(FunctionWorkflow(solve))
    assert ep.status == "ok" and ep.reward == 1.0 and ep.num_calls == 1


# ------------------------------------------------------------------ judge


class AnswerWorkflow(Workflow):
    answer: str = "42"

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        await tuner.chat(task.main_query)
        return WorkflowOutput(reward=None, metadata={"answer": self.answer})


def test_judge_scores_when_reward_is_none() -> None:
    judge = SyncJudge()
    ep, _ = run_one(AnswerWorkflow(answer="42"), judge=judge)
    assert (ep.status, ep.reward, ep.is_success) == ("ok", 0.75, True)
    assert ep.output.reward == 0.75 and ep.output.is_success is True
    ep2, _ = run_one(AnswerWorkflow(answer="41"), judge=judge)
    assert (ep2.status, ep2.reward, ep2.is_success) == ("ok", 0.0, False)
    assert judge.seen == [("t1", "42"), ("t1", "41")]


def test_judge_not_called_when_the_workflow_gives_a_reward() -> None:
    judge = SyncJudge()
    ep, _ = run_one(ChatWorkflow(result=0.5), judge=judge)
    assert ep.reward == 0.5 and judge.seen == []


def test_async_judge_is_preferred() -> None:
    judge = AsyncJudge()
    ep, _ = run_one(AnswerWorkflow(), judge=judge)
    assert judge.async_calls == 1 and (ep.reward, ep.is_success) == (0.25, False)


def test_no_reward_and_no_judge() -> None:
    ep, _ = run_one(AnswerWorkflow(), judge=None)
    assert ep.status == "failed" and ep.reason == "no_reward"
    assert "judge.type" in ep.error_message


def test_judge_error_fails_the_episode_only() -> None:
    class Broken:
        def compute_reward(self, task, output):  # noqa: ANN001
            raise ZeroDivisionError("bad parse")

    ep, factory = run_one(AnswerWorkflow(), judge=Broken())
    assert ep.status == "failed" and ep.reason == "judge_error:ZeroDivisionError"
    assert "bad parse" in ep.error_message and factory.open_attempts == 1


# ------------------------------------------------------------------ retries


def test_infrastructure_errors_are_retried_on_fresh_handles() -> None:
    factory = FakeFactory(
        [InfrastructureError("engine down"), InfrastructureError("engine down"), None]
    )
    ep, _ = run_one(ChatWorkflow(result=1.0), factory=factory, max_retries=2)
    assert ep.status == "ok" and ep.retries == 2
    assert factory.open_attempts == 3 and all(h.closed for h in factory.handles)
    assert len({id(h) for h in factory.handles}) == 3
    assert factory.opened_ids == ["t1-e0"] * 3
    # Only the successful attempt's calls are kept.
    assert ep.num_calls == 2


def test_retries_stop_at_max_retries() -> None:
    factory = FakeFactory([InfrastructureError("gateway 502")] * 5)
    ep, _ = run_one(ChatWorkflow(result=1.0), factory=factory, max_retries=1)
    assert ep.status == "failed" and ep.reason == "infrastructure:InfrastructureError"
    assert "gateway 502" in ep.error_message
    assert factory.open_attempts == 2 and ep.retries == 1


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError("peer reset"),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
    ],
)
def test_connection_errors_count_as_infrastructure(error: BaseException) -> None:
    factory = FakeFactory([error, None])
    ep, _ = run_one(ChatWorkflow(result=1.0), factory=factory)
    assert ep.status == "ok" and ep.retries == 1 and factory.open_attempts == 2


def test_openai_client_errors_from_the_gateway_are_infrastructure() -> None:
    import openai

    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    server_error = openai.InternalServerError(
        "engine failed", response=httpx.Response(500, request=request), body=None
    )
    unreachable = openai.APIConnectionError(request=request)
    factory = FakeFactory([server_error, unreachable, None])
    ep, _ = run_one(ChatWorkflow(result=1.0), factory=factory, max_retries=2)
    assert ep.status == "ok" and ep.retries == 2
    bad_request = openai.BadRequestError(
        "bad tool schema", response=httpx.Response(400, request=request), body=None
    )
    ep2, factory2 = run_one(ChatWorkflow(result=1.0), factory=FakeFactory([bad_request]))
    assert ep2.reason == "workflow_error:BadRequestError" and factory2.open_attempts == 1


def test_infrastructure_error_wrapped_by_user_code_is_still_retried() -> None:
    class Wrapping(Workflow):
        async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
            try:
                await tuner.chat("x")
            except InfrastructureError as exc:
                raise RuntimeError("agent framework failed") from exc
            return WorkflowOutput(reward=1.0)

    factory = FakeFactory([InfrastructureError("engine"), None])
    ep, _ = run_one(Wrapping(), factory=factory)
    assert ep.status == "ok" and ep.retries == 1


def test_ordinary_errors_are_never_retried() -> None:
    factory = FakeFactory([ValueError("bad json from model")] * 3)
    ep, _ = run_one(ChatWorkflow(result=1.0), factory=factory, max_retries=3)
    assert (
        ep.reason == "workflow_error:ValueError" and factory.open_attempts == 1 and ep.retries == 0
    )


def test_opening_a_session_can_fail() -> None:
    flaky = FakeFactory(open_error=lambda i: InfrastructureError("no engine") if i == 1 else None)
    ep, _ = run_one(ChatWorkflow(result=1.0), factory=flaky)
    assert ep.status == "ok" and ep.retries == 1

    broken = FakeFactory(open_error=lambda i: TypeError("bad factory"))
    ep2, _ = run_one(ChatWorkflow(result=1.0), factory=broken)
    assert ep2.status == "failed" and ep2.reason == "session_error:TypeError"
    assert broken.open_attempts == 1


# ------------------------------------------------------------------ sync workflows


def test_sync_execute_runs_in_a_worker_thread() -> None:
    class SyncWf(Workflow):
        def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:  # type: ignore[override]
            return WorkflowOutput(reward=1.0, metadata={"thread": threading.current_thread().name})

    ep, _ = run_one(SyncWf())
    assert ep.status == "ok" and ep.output.metadata["thread"].startswith("ajet-workflow")


def test_hanging_sync_workflow_times_out_and_its_thread_is_abandoned() -> None:
    release = threading.Event()

    class Hangs(Workflow):
        def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:  # type: ignore[override]
            release.wait(10)
            return WorkflowOutput(reward=1.0)

    try:
        ep, factory = run_one(Hangs(), episode_timeout_s=0.05)
        assert ep.status == "timeout" and factory.handles[0].closed
    finally:
        release.set()
