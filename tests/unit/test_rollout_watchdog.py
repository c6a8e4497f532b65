"""LoopWatchdog: a workflow that blocks the rollout's event loop is reported with its line."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from test_rollout_manager import Factory

from ajet.config.schema import RolloutConfig
from ajet.rollout.manager import RolloutManager
from ajet.rollout.runner import TaskRunner
from ajet.rollout.watchdog import LoopWatchdog
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask


class BlockingWorkflow(Workflow):
    async def execute(self, task: WorkflowTask, tuner: object) -> WorkflowOutput:
        time.sleep(1.5)  # blocking call inside an async execute
        return WorkflowOutput(reward=1.0)


class PoliteWorkflow(Workflow):
    async def execute(self, task: WorkflowTask, tuner: object) -> WorkflowOutput:
        await asyncio.sleep(1.5)
        return WorkflowOutput(reward=1.0)


def rollout(workflow: Workflow, warn_s: float) -> list:
    config = RolloutConfig(n=1, max_concurrency=2, blocked_loop_warn_s=warn_s)
    manager = RolloutManager(TaskRunner(workflow, None, Factory(), config), config)
    result = asyncio.run(manager.rollout([WorkflowTask(task_id="t0", main_query="q")]))
    return result.episodes


def test_blocked_loop_is_reported_with_the_blocking_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ajet.rollout.watchdog"):
        [episode] = rollout(BlockingWorkflow(), warn_s=0.5)
    assert episode.status == "ok"  # the watchdog only reports
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = warning.getMessage()
    assert "blocked for" in text and "test_rollout_watchdog.py" in text and "time.sleep(1.5)" in text
    assert "asyncio.to_thread" in text and "plain `def`" in text
    assert any("runs again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_awaiting_workflow_and_disabled_watchdog_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ajet.rollout.watchdog"):
        rollout(PoliteWorkflow(), warn_s=1.0)  # its loop waits in select, never blocked
        rollout(BlockingWorkflow(), warn_s=0)
    # the watchdog's own records (other loggers, e.g. the manager's first-episode line, may log)
    assert [r for r in caplog.records if r.name == "ajet.rollout.watchdog"] == []


def test_one_report_per_stall() -> None:
    async def main() -> int:
        watchdog = LoopWatchdog(asyncio.get_running_loop(), threshold_s=0.5, interval_s=0.1).start()
        try:
            time.sleep(1.5)  # one long stall
            await asyncio.sleep(0.5)
            time.sleep(1.5)  # and another
            await asyncio.sleep(0.5)
        finally:
            watchdog.stop()
        return watchdog.stalls

    assert asyncio.run(main()) == 2
