"""reasoning-gym's chain_sum from a YAML and a demonstration file: the shipped demos are what
make_demos.py makes (the dataset's answers in the adapter's own prompt, no val or test question),
and the YAML trains a GRPO step on the debug backbone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytest.importorskip("reasoning_gym", reason="the envs extra: pip install 'ajet[envs]'")


def test_the_demos_are_the_datasets_answers_and_never_a_held_out_question(example_modules, tmp_path: Path) -> None:
    from ajet.envs import make_env_tasks
    from ajet.envs.demos import yaml_without_sft

    example_modules(HERE, "make_demos")
    import make_demos

    shipped = (HERE / "demos.jsonl").read_text()
    made = make_demos.main(out_dir=tmp_path)
    assert made.read_text() == shipped  # regenerated exactly: the file is what the script makes
    rows = [json.loads(line) for line in shipped.splitlines()]
    cfg = yaml_without_sft(HERE / "chain_sum.yaml").env
    train, val, test = make_env_tasks(cfg)
    held_out = {t.main_query for t in (*val, *test)}
    assert len(rows) >= 200 and len(val) >= 32 and len(test) >= 32
    for row in rows:
        system, user, reply = row["messages"]
        assert system == train[0].init_messages[0]  # the prompt the model sees during RL
        assert user["content"] not in held_out
        a, op, b = user["content"].split(":")[1].strip(" =").split()  # "51 + 22"
        assert reply["content"] == f"<answer>{int(a) + int(b) if op == '+' else int(a) - int(b)}</answer>"


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_grpo_step_from_the_yaml(one_step) -> None:
    run = one_step(HERE / "chain_sum.yaml", "pipeline.stages=[]", "pipeline.overrides.sft=null")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0 and metrics["rollout/calls_per_episode"] == 1
    assert metrics["workflow/answer_tagged"] == 0.0  # the tiny random model writes no tag
