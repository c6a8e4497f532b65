"""`rollout.max_staleness: 1` on the debug backbone: step 2's episodes roll out during step 1's
update, on the engine's copy of the weights, and the run trains and ends cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_debug_backbone import ajet, make_run

pytestmark = pytest.mark.integration


def test_the_next_step_rolls_out_during_the_update(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    result = ajet("--conf", str(conf), "rollout.max_staleness=1", "rollout.engine_dtype=float16",
                  "algorithm.tis_cap=2", "trainer.total_steps=3", "trainer.val_every=0", "trainer.save_every=0")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "exp" / "tiny" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["rollout/prefetched"] for r in train] == [0.0, 1.0, 1.0]
    assert all(r["rollout/staleness_max"] <= 1 for r in train)
    assert [r["policy_version"] for r in train] == [1.0, 2.0, 3.0]
    assert all("actor/tis_weight" in r for r in train)
    # A prefetched batch was generated during the previous update too: its tokens per second
    # count the time since that batch arrived, not only the (short) wait for it.
    assert all(r["perf/generation_s"] > r["perf/rollout_s"] for r in train if r["rollout/prefetched"])
    assert train[0]["perf/generation_s"] == train[0]["perf/rollout_s"]
    # tok/s is the engine's count of decoded tokens over each window: the windows tile the run,
    # so they add up to every completion token of the run (all trained here: one call an episode).
    decoded = sum(r["perf/tokens_per_s"] * r["perf/generation_s"] for r in train)
    trained = sum(sum(json.loads(line)["loss_mask"]) for path in (tmp_path / "exp" / "tiny" / "records").glob("*.jsonl")
                  for line in path.read_text().splitlines())
    assert trained > 0 and round(decoded) == trained


def test_the_overlap_needs_an_engine_copy_and_tis(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    result = ajet("--conf", str(conf), "--dry-run", "rollout.max_staleness=1")
    assert result.returncode != 0
    assert "rollout.engine_dtype=float16" in result.stderr and "algorithm.tis_cap" in result.stderr
