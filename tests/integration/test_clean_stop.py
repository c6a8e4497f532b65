"""SIGTERM, SIGINT and SIGHUP stop `ajet train` cleanly (issue 52): exit 130 with where the run
stands and how to resume, a checkpoint of the last logged step (so nothing logged is lost and
nothing is logged twice), and `--resume` trains every later step once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_debug_backbone import make_run, train_steps

pytestmark = pytest.mark.integration


# SIGINT is the kill-anywhere chains' (tests/integration/kill_anywhere.py): it stops every phase there.
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_stops_the_run_with_its_last_step_committed_and_resume_continues(
        tmp_path: Path, tiny_model_dir: Path, signum: signal.Signals) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    run = tmp_path / "exp" / "tiny"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
    # save_every=0, the default: before, a stop other than Ctrl-C saved nothing.
    overrides = ["trainer.total_steps=40", "trainer.val_every=0", "trainer.save_every=0"]
    proc = subprocess.Popen([sys.executable, "-m", "ajet.cli.main", "--conf", str(conf), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(s >= 2 for s in logged_steps(run)):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert f"ajet: stopped ({signum.name})" in err and "--resume" in err, err[-3000:]
    steps = train_steps(run)
    assert len(steps) == len(set(steps)) and steps == list(range(1, len(steps) + 1))
    saved = (run / "checkpoints" / "latest").read_text().strip()
    assert saved == f"step_{steps[-1]:06d}"  # every logged step is committed: none is lost
    assert f"the newest checkpoint is {run / 'checkpoints' / saved}" in err

    total = steps[-1] + 2
    resumed = subprocess.run([sys.executable, "-m", "ajet.cli.main", "--conf", str(conf), "--resume",
                              f"trainer.total_steps={total}", *overrides[1:]],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert train_steps(run) == list(range(1, total + 1))  # each step once


def logged_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # being written
            continue
    return [r["step"] for r in rows if r.get("split") == "train"]
