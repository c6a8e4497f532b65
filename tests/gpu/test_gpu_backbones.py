"""A few steps of the math tutorial on one GPU with the trinity and verl backbones.

Skipped without CUDA, and without the backbone's package and vllm: run them from the GPU
environments (`make env-trinity GPU=1` / `make env-verl GPU=1`, see docs/backbones.md). Never
run on the machines this project was written on (no GPU there). tests/backbones runs the
plugins against the real packages on CPU; these tests are the GPU half, not yet executed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "tutorial" / "example_math_agent" / "math_agent.yaml"
SMALL = ["trainer.total_steps=2", "trainer.batch_size=2", "rollout.n=2", "rollout.max_tokens=64",
         "trainer.val_every=0", "trainer.save_every=1", "context.max_sample_tokens=2048"]


def ajet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CI": "true"}
    return subprocess.run([sys.executable, "-m", "ajet.cli.main", "--conf", str(CONF), "--exp-dir",
                           str(tmp_path / "exp"), *args], capture_output=True, text=True, timeout=3600, env=env)


def test_trinity_math_tutorial_two_steps_on_one_gpu(tmp_path: Path) -> None:
    pytest.importorskip("trinity")
    pytest.importorskip("vllm")
    out = ajet(tmp_path, "--backbone=trinity", "trinity.explorer_gpus=1", "trinity.trainer_gpus=0", *SMALL)
    assert out.returncode == 0, out.stderr[-5000:]
    run = tmp_path / "exp" / "math_agent"
    assert (run / "trinity_config.yaml").is_file() and (run / "tasks" / "train.jsonl").is_file()
    assert any((run / "trinity").glob("global_step_*")), sorted(p.name for p in (run / "trinity").iterdir())


def test_verl_math_tutorial_two_steps_on_one_gpu(tmp_path: Path) -> None:
    pytest.importorskip("verl")
    pytest.importorskip("vllm")
    out = ajet(tmp_path, "--backbone=verl", "verl.n_gpus_per_node=1", "verl.gpu_memory_utilization=0.4", *SMALL)
    assert out.returncode == 0, out.stderr[-5000:]
    ckpts = tmp_path / "exp" / "math_agent" / "verl" / "checkpoints"
    assert (ckpts / "global_step_2").is_dir(), sorted(p.name for p in ckpts.iterdir()) if ckpts.is_dir() else "none"
