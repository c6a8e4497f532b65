"""The kill-anywhere harness (tests/integration/kill_anywhere.py), double mode (issue 69 §2): every
stop is followed by a second one 0.2 s later, and every checkpoint write is slowed, so a second
stop lands while the first waits for the update or for a write. Before, a stop inside a write
raised in torch.save (exit 1, "stopping on RuntimeError", the step saved twice), and a second
Ctrl-C during the update saved weights that the update was still changing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.kill_anywhere import chain_id, chains, stop_at_every_phase_and_resume

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("signum", chains("double"), ids=chain_id)
def test_a_run_stopped_twice_at_every_phase_and_resumed_trains_each_step_and_task_once(
        tmp_path: Path, tiny_model_dir: Path, signum: signal.Signals | None) -> None:
    stop_at_every_phase_and_resume(tmp_path, tiny_model_dir, "double", signum)
