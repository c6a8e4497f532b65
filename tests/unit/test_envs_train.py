"""One training step on the tiny model for each environment adapter (issue 73), from a config
that names only the environment: the tasks, the workflow and the reward are the adapter's.
(Gymnasium's also runs through the CLI: tutorial/example_gym_frozenlake.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ajet.backbones.registry import checked_backbone
from ajet.config import load_config

pytest.importorskip("reasoning_gym", reason="the envs extra: pip install 'ajet[envs]'")
pytest.importorskip("gymnasium", reason="the envs extra: pip install 'ajet[envs]'")

ONE_STEP = ["trainer.total_steps=1", "trainer.batch_size=2", "rollout.n=2", "rollout.max_tokens=8",
            "trainer.val_every=0", "trainer.save_every=0", "logging.tensorboard=false",
            "env.train_size=4", "env.val_size=2", "env.test_size=2"]


def train_one_step(tmp_path: Path, tiny_model_dir: Path, *env: str) -> dict:
    from ajet.pipeline import run  # imports torch

    cfg = load_config(None, [*env, *ONE_STEP, f"model.path={tiny_model_dir}", f"project.exp_dir={tmp_path}",
                             "project.name=env"])
    run(cfg, checked_backbone("debug", cfg, "test"), backbone="debug")
    rows = [json.loads(line) for line in (tmp_path / "env" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if r.get("split") == "train" and r["step"] == 1]
    assert step["rollout/episodes"] == 4 and step["rollout/failed"] == 0
    return step


@pytest.mark.integration
def test_one_step_on_a_reasoning_gym_dataset(tmp_path: Path, tiny_model_dir: Path) -> None:
    step = train_one_step(tmp_path, tiny_model_dir, "env.type=reasoning_gym", "env.id=basic_arithmetic")
    # The tiny random model writes no <answer> tag: the dataset's scorer gives 0, logged as such.
    assert step["reward/mean"] == 0.0 and step["workflow/answer_tagged"] == 0.0
    assert step["context/calls"] == 4  # one call per episode


@pytest.mark.integration
def test_one_step_on_a_gymnasium_env(tmp_path: Path, tiny_model_dir: Path) -> None:
    step = train_one_step(tmp_path, tiny_model_dir, "env.type=gymnasium", "env.id=Blackjack-v1", "env.max_turns=3")
    assert 1 <= step["workflow/turns"] <= 3 and step["context/calls"] == 4 * step["workflow/turns"]
