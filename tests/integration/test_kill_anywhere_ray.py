"""The kill-anywhere harness (tests/integration/kill_anywhere.py), --with-ray mode (issue 69 §2):
the episodes run in a Ray actor. Before, the launcher's and then Ray's own SIGTERM handler
replaced ajet's inside the run: a SIGTERM raised at once while the update thread ran, the loop
saved "step 1" with AdamW state counts of 2, and the process aborted with rc 134."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.kill_anywhere import chain_id, chains, stop_at_every_phase_and_resume

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("signum", chains("ray"), ids=chain_id)
def test_a_ray_run_stopped_at_every_phase_and_resumed_trains_each_step_and_task_once(
        tmp_path: Path, tiny_model_dir: Path, signum: signal.Signals | None) -> None:
    pytest.importorskip("ray", reason="--with-ray needs ray (installed by make install)")
    stop_at_every_phase_and_resume(tmp_path, tiny_model_dir, "ray", signum)
