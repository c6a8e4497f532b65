"""scripts/bench/learning.py's served row for real, on the tiny model: `ajet eval` of the base
model on test, `ajet serve` with agent.py clients for one step, `ajet eval` of its final model,
read back like a pipeline run (base -> trained, the serve stage's tokens, the curve)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def bench(script: Any) -> Any:
    return script("bench.learning")


def test_the_remote_agent_row_evaluates_serves_to_clients_and_evaluates_again(
        bench: Any, tmp_path: Path, tiny_model_dir: Path, vowel_judge: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (e,) = bench.select("remote_agent")
    e = bench.replace(e, served=bench.replace(e.served, clients=2), overrides=(f"judge.type={vowel_judge}",
        f"model.path={tiny_model_dir}", "rollout.n=2", "rollout.max_tokens=80", "trainer.batch_size=2",
        "trainer.total_steps=1", "trainer.save_every=0", "trainer.lr=0.01", "logging.tensorboard=false",
        "eval.max_tasks=8"))  # 8 of the 32 test tasks: the row is read the same, in a quarter of the time
    result = bench.run_example(e, tmp_path / "exp", cached_base=False)
    run = tmp_path / "exp" / "remote_agent"
    assert result.status in ("pass", "FAIL", "inconclusive"), result.status  # the tiny model scores what it scores
    assert result.command[result.command.index("--conf") - 1] == "serve"
    base = json.loads((run / "eval" / "eval_base.json").read_text())
    trained = json.loads((run / "eval" / "eval_trained.json").read_text())
    assert base["split"] == trained["split"] == "test" and base["metrics"]["episodes"] == 8
    assert trained["model"] == str(run / "final_model")
    # agent.py's own solve ran in-process: the forced calculate call, then the answer; none failed
    assert base["metrics"]["steps/calls_per_episode"] == 2 and base["metrics"]["failed"] == 0
    assert base["metrics"]["agent/tool_call_rate"] == 1
    assert (result.base, result.trained) == (base["metrics"]["success/rate"], trained["metrics"]["success/rate"])
    # the serve stage trained on the clients' episodes
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in train if r.get("split") == "train"] == [1]
    assert result.tokens_trained > 0
    assert [p["label"] for p in result.points] == ["eval base (test)", "eval trained (test)"]
