"""ajet.envs.demos: demonstrations played by a scripted policy through an adapter's own workflow
(the SFT warm-ups of tutorial/example_reasoning_gym and tutorial/example_gym_frozenlake): only
episodes that succeed are written, in the SFT dialog format, from a seed range of their own, none
with a val or test question; an environment error leaves the demo out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ajet.config.schema import EnvConfig, EnvType, GymnasiumEnvConfig
from ajet.envs import make_env_tasks
from ajet.envs.demos import demo_tasks, write_demos
from ajet.workflow import WorkflowTask

pytest.importorskip("reasoning_gym", reason="the envs extra: pip install 'ajet[envs]'")


def sums(**kw: Any) -> EnvConfig:
    # one-digit sums of two terms: few distinct questions, so demo items meet val and test ones
    return EnvConfig(type=EnvType.reasoning_gym, id="chain_sum", train_size=4, val_size=20, test_size=20,
                     args={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, **kw)


def right(messages: list[dict[str, Any]], task: WorkflowTask) -> str:
    return f"<answer>{task.metadata['answer']}</answer>"


def test_successful_episodes_become_sft_dialogs_of_the_workflows_messages(tmp_path: Path) -> None:
    cfg = sums()
    written, played = write_demos(cfg, right, tmp_path / "demos.jsonl", seeds_from=3_000_000, count=40)
    rows = [json.loads(line) for line in (tmp_path / "demos.jsonl").read_text().splitlines()]
    assert written == played == len(rows) and 0 < played < 40  # demo items that are val/test questions: out
    _, val, test = make_env_tasks(cfg)
    held_out = {t.main_query for t in (*val, *test)}
    for row in rows:
        system, user, reply = row["messages"]
        assert system["role"] == "system" and "<answer>" in system["content"]  # the adapter's own prompt
        assert user["content"] not in held_out and reply["role"] == "assistant"
        assert reply["content"].startswith("<answer>") and row["task_type"] == "reasoning_gym:chain_sum"
    assert [t.task_id for t in demo_tasks(cfg, 3_000_000, 40)] == [r["id"] for r in rows]  # deterministic

    wrong = write_demos(cfg, lambda m, t: "<answer>x</answer>", tmp_path / "none.jsonl", seeds_from=3_000_000,
                        count=10)
    assert wrong[0] == 0 and (tmp_path / "none.jsonl").read_text() == ""  # no success, no demonstration


def test_multi_turn_demos_are_the_last_calls_messages_and_an_env_error_leaves_one_out(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium", reason="the envs extra: pip install 'ajet[envs]'")
    lake = EnvConfig(type=EnvType.gymnasium, id="FrozenLake-v1", args={"is_slippery": False}, train_size=1,
                     val_size=0, test_size=0, max_turns=8,
                     gymnasium=GymnasiumEnvConfig(actions=["left", "down", "right", "up"]))
    path = ["right", "right", "down", "down", "down", "right"]  # FrozenLake-v1's own 4x4 map

    def walk(messages: list[dict[str, Any]], task: WorkflowTask) -> str:
        return path[sum(m["role"] == "assistant" for m in messages)]

    written, played = write_demos(lake, walk, tmp_path / "lake.jsonl", seeds_from=5, count=2)
    (row, _) = [json.loads(line) for line in (tmp_path / "lake.jsonl").read_text().splitlines()]
    assert (written, played) == (2, 2)
    assert [m["content"] for m in row["messages"] if m["role"] == "assistant"] == path
    assert row["messages"][-2]["content"].endswith("Your action?")

    def breaks(messages: list[dict[str, Any]], task: WorkflowTask) -> str:
        from ajet.envs import EnvError

        if task.metadata["env"]["seed"] == 5:
            raise EnvError("the environment broke")
        return walk(messages, task)

    assert write_demos(lake, breaks, tmp_path / "one.jsonl", seeds_from=5, count=2) == (1, 2)
