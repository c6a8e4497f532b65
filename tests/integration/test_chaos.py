"""scripts/chaos.py in CI: a tiny training with raising, hanging, NaN and late-calling
episodes, killed with SIGKILL and resumed, keeps every promise it checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_chaos_run_survives_and_writes_every_step_once(tmp_path: Path, bundled_model_dir) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--steps", "4", "--kill-after", "2",
         "--work-dir", str(tmp_path / "chaos"), "--limit-s", "400"],
        capture_output=True, text=True, env=env, timeout=850,
    )
    out = proc.stdout + proc.stderr
    assert "run 2 (--resume): exit 0" in out, out  # completed; the hung threads let it exit
    failures = [line for line in out.splitlines() if line.startswith("FAIL:")]
    duplicates = [line for line in failures if "metrics.jsonl steps" in line]
    assert failures == duplicates, out  # counts as injected, late calls refused, weights finite
    if duplicates:
        pytest.xfail("--resume does not yet drop the metrics past the resumed checkpoint "
                     f"(issue 16, item 12): {duplicates[0]}")
    assert proc.returncode == 0 and "OK: completed" in out, out
