"""The debug backbone trains for real: weights change, checkpoints resume, SIGKILL is survivable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.cli import ajet as fork_ajet

pytestmark = pytest.mark.integration

WORKFLOW = '''
from ajet import Workflow, WorkflowOutput


class CountVowels(Workflow):
    """Reward depends on the sampled text, so episodes of one task differ (GRPO signal)."""

    async def execute(self, task, tuner):
        client = tuner.openai_client()
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task.main_query}]
        )
        text = reply.choices[0].message.content or ""
        reward = sum(ch in "aeiou" for ch in text) / max(1, len(text))
        return WorkflowOutput(reward=reward, is_success=reward > 0.3)
'''


def make_run(tmp_path: Path, model_dir: Path, extra: str = "") -> Path:
    (tmp_path / "agent.py").write_text(WORKFLOW)
    lines = [json.dumps({"task_id": f"t{i}", "question": f"Say something about the number {i}."}) for i in range(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "val.jsonl").write_text("\n".join(lines[:2]) + "\n")
    conf = tmp_path / "run.yaml"
    conf.write_text(
        f"""
project: {{name: tiny, exp_dir: {tmp_path / 'exp'}}}
model: {{path: {model_dir}}}
workflow: {{target: agent.py:CountVowels}}
task_reader: {{jsonl: {{train_path: train.jsonl, val_path: val.jsonl}}}}
rollout: {{n: 2, max_tokens: 8, temperature: 1.0}}
trainer: {{total_steps: 2, batch_size: 2, lr: 0.01, save_every: 1, val_every: 2}}
logging: {{tensorboard: false}}
{extra}
"""
    )
    return conf


def ajet(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return fork_ajet(*args, timeout=timeout)  # a child of the fork server: the imports once


def train_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [r["step"] for r in rows if r["split"] == "train"]


def test_two_steps_change_weights_and_resume(tmp_path: Path, tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    conf = make_run(tmp_path, tiny_model_dir)
    result = ajet("--conf", str(conf))
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "exp" / "tiny"
    assert train_steps(run) == [1, 2]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r["split"] == "val" and "val/reward/mean" in r for r in rows)
    train_rows = [r for r in rows if r["split"] == "train"]
    # the engine's prefix cache: two calls of an episode share history, so some prompt tokens are reused
    assert all(0 < r["engine/prefilled_tokens"] <= r["engine/prompt_tokens"] for r in train_rows)
    assert all(0.0 <= r["engine/cache_hit_rate"] <= 1.0 for r in train_rows)
    assert (run / "records" / "step_000001.jsonl").is_file()
    record = json.loads((run / "records" / "step_000001.jsonl").read_text().splitlines()[0])
    assert len(record["tokens"]) == len(record["input_ids"]) == len(record["loss_mask"])
    assert any(record["loss_mask"])

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no weight changed after two training steps"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    # The run ends with its summary: val before -> after, wall time, how to look at it.
    assert "run summary" in result.stdout and "val success" in result.stdout
    assert "ajet view" in result.stdout and "ajet report" in result.stdout

    # Same config without --resume refuses to overwrite the run.
    again = ajet("--conf", str(conf))
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = ajet("--conf", str(conf), "--resume", "trainer.total_steps=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "(step 2)" in resumed.stderr
    assert train_steps(run) == [1, 2, 3]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"


def test_sigkill_mid_run_then_resume_continues(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    run = tmp_path / "exp" / "tiny"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ajet.cli.main", "--conf", str(conf), "trainer.total_steps=50", "trainer.val_every=0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (run / "checkpoints" / "step_000002").is_dir():
            time.sleep(0.2)
        assert (run / "checkpoints" / "step_000002").is_dir(), "no checkpoint appeared in time"
        time.sleep(0.3)  # land somewhere inside a later step (or a checkpoint write)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    latest = (run / "checkpoints" / "latest").read_text().strip()
    saved_step = int(latest.split("_")[1])
    assert saved_step >= 2

    resumed = ajet("--conf", str(conf), "--resume", f"trainer.total_steps={saved_step + 1}", "trainer.val_every=0")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {saved_step})" in resumed.stderr
    steps = train_steps(run)
    assert steps[-1] == saved_step + 1
    assert sorted(set(steps)) == list(range(1, saved_step + 2))
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_lora_with_kl_to_the_lora_disabled_base(tmp_path: Path, tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    conf = make_run(tmp_path, tiny_model_dir)
    result = ajet(
        "--conf", str(conf), "trainer.total_steps=1", "trainer.val_every=0",
        "model.lora.enabled=true", "model.lora.r=4", "trainer.lr=0.05",
        "algorithm.kl_coef=0.1", "algorithm.kl_reference=lora_base",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "exp" / "tiny"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert len(train) == 1 and "actor/kl" in train[0]
    # The checkpoint holds only the adapter; the final model is merged and loads with plain transformers.
    weights = torch.load(run / "checkpoints" / "step_000001" / "weights.pt", weights_only=True)
    assert weights and all("lora_" in name for name in weights)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    assert set(before) == set(after)
    assert any(not torch.equal(before[k], after[k]) for k in before if "q_proj" in k)


@pytest.mark.parametrize("engine_dtype, lora", [("float16", True), ("bfloat16", False), ("auto", False)])
def test_lower_precision_engine_logs_its_mismatch_and_trains_with_tis(
        tmp_path: Path, tiny_model_dir: Path, engine_dtype: str, lora: bool) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    extra = ["model.lora.enabled=true", "model.lora.r=4"] if lora else []
    result = ajet("--conf", str(conf), "trainer.val_every=0", "trainer.lr=0.05",
                  f"rollout.engine_dtype={engine_dtype}", "algorithm.tis_cap=2.0", *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    if engine_dtype == "auto":  # the fastest copy this machine has; a 2-byte one on any x86 CPU
        import torch

        from ajet.engine.weights import fastest_engine_dtype

        engine_dtype = fastest_engine_dtype(torch.device("cpu"))
        assert f"engine_dtype auto: {engine_dtype} on this machine" in result.stderr
        assert engine_dtype != "float32"
    rows = [json.loads(line) for line in (tmp_path / "exp" / "tiny" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train" and "actor/loss" in r]
    assert len(train) == 2
    for row in train:
        # Step 2 samples with the copy refreshed after step 1's update: a stale copy would
        # give the logprobs of the old weights (a mismatch of the size of the update).
        assert 0 < row["rollout/logprob_mismatch"] < (0.01 if engine_dtype == "float16" else 0.1)
        assert 0 < row["actor/tis_weight"] <= 2.0
