"""SFT -> DPO -> eval as one staged run through the real CLI on the tiny model, then the
stages one by one (`ajet sft`, `ajet eval --model`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.cli import ajet as fork_ajet

pytestmark = pytest.mark.integration

WORKFLOW = '''
from ajet import WorkflowOutput


async def vowels(task: dict, model) -> WorkflowOutput:
    """Reward = share of vowels in the reply, so a task's episodes differ (DPO pairs)."""
    client = model.openai_client()
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["main_query"]}]
    )
    text = reply.choices[0].message.content or ""
    reward = sum(ch in "aeiou" for ch in text) / max(1, len(text))
    return WorkflowOutput(reward=reward, is_success=reward > 0.3, metadata={"tools_used": ["speak"]})
'''


def make_run(tmp_path: Path, model_dir: Path) -> Path:
    (tmp_path / "agent.py").write_text(WORKFLOW)
    tasks = [{"task_id": f"t{i}", "question": f"Say something about the number {i}.",
              "target_tools": ["speak"], "optimal_steps": 1} for i in range(6)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks[:2]))
    dialogs = []
    for i in range(6):
        messages = [{"role": "user", "content": f"Say something about the number {i}."},
                    {"role": "assistant", "content": "aeiou " * (i + 1)}]
        dialogs.append({"messages": messages, "task_type": "even" if i % 2 == 0 else "odd"})
    (tmp_path / "dialogs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in dialogs))
    conf = tmp_path / "run.yaml"
    conf.write_text(f"""
project: {{name: pipe, exp_dir: {tmp_path / 'exp'}}}
model: {{path: {model_dir}}}
workflow: {{target: agent.py:vowels}}
task_reader: {{jsonl: {{train_path: train.jsonl, val_path: val.jsonl}}}}
rollout: {{n: 2, max_tokens: 8, temperature: 1.0}}
sft: {{train_path: dialogs.jsonl, dev_fraction: 0.2, epochs: 2, batch_size: 2,
       task_weights: {{even: 1.0, odd: 0.5}}}}
algorithm: {{dpo_beta: 0.5}}
trainer: {{total_steps: 2, batch_size: 2, lr: 0.01}}
eval: {{n: 2}}
pipeline:
  stages: [sft, dpo, eval]
  overrides: {{dpo: {{trainer: {{total_steps: 1}}}}}}
logging: {{tensorboard: false}}
""")
    return conf


def ajet(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return fork_ajet(*args, timeout=timeout)  # a child of the fork server: the imports once


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def changed(before_dir: Path, after_dir: Path) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(before_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(after_dir).state_dict()
    return [k for k in before if not torch.equal(before[k], after[k])]


def test_sft_dpo_eval_pipeline(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    result = ajet("--conf", str(conf))
    assert result.returncode == 0, result.stderr[-4000:]
    run = tmp_path / "exp" / "pipe"
    sft_dir, dpo_dir = run / "stages" / "01_sft", run / "stages" / "02_dpo"

    # SFT: 5 train dialogs (1 held out), weights even 1 / odd 0.5 -> 4 per epoch, 2 epochs of 2 batches
    sft_rows = rows(sft_dir)
    train = [r for r in sft_rows if r["split"] == "train" and r["step"] > 0]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    dev = [r for r in sft_rows if r["split"] == "val"]
    assert [r["step"] for r in dev] == [0, 2, 4] and dev[-1]["val/sft/loss"] < dev[0]["val/sft/loss"]
    assert changed(tiny_model_dir, sft_dir / "final_model")

    # DPO: starts from the SFT model, one step with pairs, weights move again
    dpo_config = (dpo_dir / "config.yaml").read_text()
    assert str(sft_dir / "final_model") in dpo_config and "name: dpo" in dpo_config
    (step,) = [r for r in rows(dpo_dir) if r["split"] == "train"]
    assert step["dpo/pairs"] >= 1 and "dpo/loss" in step and step["rollout/episodes"] == 4
    assert changed(sft_dir / "final_model", dpo_dir / "final_model")

    # eval of the DPO model on the 2 val tasks x 2 episodes
    report = json.loads((run / "eval" / "eval_03_dpo.json").read_text())
    assert report["model"] == str(dpo_dir / "final_model") and report["split"] == "val"
    m = report["metrics"]
    assert m["episodes"] == 4 and m["tasks"] == 2 and m["failed"] == 0
    assert m["tool/f1"] == 1.0 and m["steps/efficiency"] == 1.0  # one call, the target tool reported
    assert 0.0 <= m["reward/mean"] <= 1.0 and 0.0 <= m["pass@1"] <= m["pass@2"] <= 1.0
    pipeline = json.loads((run / "pipeline.json").read_text())
    assert [s["stage"] for s in pipeline["stages"]] == ["sft", "dpo", "eval"]
    assert pipeline["final_model"] == str(dpo_dir / "final_model")
    seconds = [s["seconds"] for s in pipeline["stages"]]
    assert all(isinstance(x, float) and x > 0 for x in seconds), seconds
    # The summary says what each stage took.
    assert "stages: 01 sft {:.0f} s, 02 dpo {:.0f} s, 03 eval {:.0f} s".format(*seconds) in result.stdout

    # Rerunning without --resume refuses; with --resume every stage is already done.
    again = ajet("--conf", str(conf))
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = ajet("--conf", str(conf), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stage 1 (sft) already done" in resumed.stderr and "stage 2 (dpo) already done" in resumed.stderr
    # The skipped stages keep the seconds they ran; the eval stage's report was there too.
    assert [s["seconds"] for s in json.loads((run / "pipeline.json").read_text())["stages"]] == seconds


def test_sft_then_eval_commands(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    result = ajet("sft", "--conf", str(conf), "sft.epochs=1", "sft.coreset.strategy=loss_topk",
                  "sft.coreset.size=3", "sft.rounds=2", "sft.replay.buffer_size=4", "sft.replay.ratio=0.5",
                  "sft.task_weights.odd=1.0")
    assert result.returncode == 0, result.stderr[-4000:]
    run = tmp_path / "exp" / "pipe"
    setup = rows(run)[0]
    assert setup["coreset/selected"] == 3 and setup["coreset/total"] == 5
    assert setup["coreset/selected/loss"] >= setup["coreset/all/loss"]  # the hardest ones
    # round 0: 2 of the 3 selected dialogs; round 1: its 1 dialog + 1 replayed (ratio 0.5)
    steps = [r for r in rows(run) if r["split"] == "train" and r["step"] > 0]
    assert [(r["sft/round"], r["sft/dialogs"]) for r in steps] == [(0, 2), (1, 2)]
    model = run / "final_model"
    out = ajet("eval", "--conf", str(conf), "--model", str(model), "--n", "1", "--split", "train",
               "--name", "after_sft")
    assert out.returncode == 0, out.stderr[-4000:]
    assert "pass@1" in out.stdout and "after_sft" in out.stdout
    assert ": 6 train tasks x 1 on" in out.stderr and "EvalSplit" not in out.stderr  # the split's name
    report = json.loads((run / "eval" / "eval_after_sft.json").read_text())
    assert report["model"] == str(model) and report["split"] == "train" and report["metrics"]["episodes"] == 6


def test_lora_sft_then_dpo_against_the_lora_base(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_run(tmp_path, tiny_model_dir)
    result = ajet("--conf", str(conf), "pipeline.stages=[sft,dpo]", "model.lora.enabled=true",
                  "model.lora.r=4", "algorithm.dpo_reference=lora_base", "sft.epochs=1", "trainer.lr=0.05")
    assert result.returncode == 0, result.stderr[-4000:]
    run = tmp_path / "exp" / "pipe"
    sft_dir, dpo_dir = run / "stages" / "01_sft", run / "stages" / "02_dpo"
    import torch

    weights = torch.load(sft_dir / "checkpoints" / "step_000002" / "weights.pt", weights_only=True)
    assert weights and all("lora_" in name for name in weights)  # checkpoints hold the adapter only
    assert changed(tiny_model_dir, sft_dir / "final_model")  # merged into a plain HF checkpoint
    (step,) = [r for r in rows(dpo_dir) if r["split"] == "train"]
    assert step["dpo/pairs"] >= 1
    assert changed(sft_dir / "final_model", dpo_dir / "final_model")
