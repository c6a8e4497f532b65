"""The kill-anywhere harness (tests/integration/kill_anywhere.py), serve mode: `ajet serve` with client threads that keep working across the server's restarts."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.kill_anywhere import chain_id, chains, stop_at_every_phase_and_resume

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("signum", chains("serve"), ids=chain_id)
def test_a_run_stopped_at_every_phase_and_resumed_trains_each_step_and_task_once(
        tmp_path: Path, tiny_model_dir: Path, signum: signal.Signals | None) -> None:
    stop_at_every_phase_and_resume(tmp_path, tiny_model_dir, "serve", signum)
