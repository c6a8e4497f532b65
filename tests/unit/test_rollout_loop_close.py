"""A stop (Ctrl-C, SIGTERM) in the middle of a rollout leaves its episodes' tasks pending on the
rollout's event loop. Closed as they were, the loop printed "ERROR asyncio: Task was destroyed but
it is pending!" once per episode after "ajet: stopped"; `cancel_pending` ends them first, as
`asyncio.run` does, and each episode's cleanup runs."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from ajet.rollout.engine_rollout import cancel_pending


def _interrupted_rollout(cleaned: list[int]) -> asyncio.AbstractEventLoop:
    """A loop whose `run_until_complete` a KeyboardInterrupt ended while 3 episodes ran."""
    loop = asyncio.new_event_loop()

    async def episode(i: int) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # cleanup that awaits (an episode's close_handle)
            cleaned.append(i)
            raise

    def stop() -> None:
        raise KeyboardInterrupt("SIGTERM")

    async def rollout() -> None:
        loop.call_later(0.05, stop)
        await asyncio.gather(*(asyncio.create_task(episode(i)) for i in range(3)))

    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(rollout())
    return loop


def _destroyed(caplog: pytest.LogCaptureFixture) -> list[str]:
    gc.collect()
    return [r.getMessage() for r in caplog.records if "Task was destroyed" in r.getMessage()]


def test_an_interrupted_rollouts_loop_closes_with_its_episodes_cancelled_and_cleaned_up(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    cleaned: list[int] = []
    loop = _interrupted_rollout(cleaned)
    cancel_pending(loop)
    loop.close()
    assert sorted(cleaned) == [0, 1, 2]
    assert _destroyed(caplog) == []


def test_without_it_the_loop_reports_each_pending_episode(caplog: pytest.LogCaptureFixture) -> None:
    """What the test above guards against, shown on the same loop."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    cleaned: list[int] = []
    loop = _interrupted_rollout(cleaned)
    loop.close()
    assert cleaned == [] and len(_destroyed(caplog)) >= 3


def test_an_episode_that_ignores_its_cancellation_is_left_after_the_wait_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue

    def stop() -> None:
        raise KeyboardInterrupt

    loop.call_later(0.05, stop)
    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(stubborn())
    caplog.set_level(logging.WARNING, logger="ajet.rollout.engine_rollout")
    cancel_pending(loop, wait_s=0.2)
    assert "1 episode task(s) did not end within 0.2 s of their cancellation" in caplog.text
    for task in asyncio.all_tasks(loop):  # let the test end it
        task.get_coro().close()
    loop.close()
