"""scripts/bench/tinker_cookbook.py's reading of the recipe's metrics: the rise is the best mean of
`window` consecutive steps after step 0, minus step 0 (the base policy's reward)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.bench.tinker_cookbook import read_steps, rise


def test_the_rise_is_the_best_window_after_step_0_minus_step_0() -> None:
    steps = [{"env/all/reward/total": r} for r in (-0.1, 0.0, 0.3, 0.0, 0.2, 0.5, 0.2)]
    assert rise(steps, 3) == pytest.approx(0.3 - -0.1)  # (0.2 + 0.5 + 0.2) / 3
    assert rise(steps, 1) == pytest.approx(0.6)
    assert rise(steps[:3], 3) is None  # not yet a window after step 0


def test_read_steps_keeps_reward_rows_and_skips_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert read_steps(path) == []
    rows = [{"step": 0, "env/all/reward/total": 0.1}, {"step": 0, "test/x": 1}, {"step": 1, "env/all/reward/total": 0.2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "env/al')
    assert [r["step"] for r in read_steps(path)] == [0, 1]
