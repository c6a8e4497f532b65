"""Gymnasium's FrozenLake-v1 from a YAML alone trains for one step on the debug backbone: the
tasks come from the environment, the workflow is the adapter's, the turns of an episode merge
into one sample, and the environment's metrics reach metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytest.importorskip("gymnasium", reason="the envs extra: pip install 'ajet[envs]'")


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_from_the_yaml_alone(one_step) -> None:
    run = one_step(HERE / "gym_frozenlake.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    # One call per turn, up to max_turns (8). The tiny random model's replies seldom name a move,
    # but now and then one holds "up" or "left" (its sampling differs between CPUs): most turns are
    # invalid moves, and an episode ends early only if a move reaches a hole or the goal.
    assert metrics["workflow/turns"] == metrics["rollout/calls_per_episode"] <= 8
    assert metrics["workflow/turns"] / 2 < metrics["workflow/invalid_moves"] <= metrics["workflow/turns"]
    assert 0.0 <= metrics["workflow/return"] <= 1.0
    assert metrics["context/samples"] == metrics["rollout/ok"]  # each episode's calls: one sample
    records = run.records(1)
    assert len(records) == metrics["rollout/ok"]
    assert sum(len(r["segments"]) for r in records) / len(records) == metrics["workflow/turns"]
    for r in records:
        assert 1 <= len(r["segments"]) <= 8 and all(all(r["loss_mask"][a:b]) for a, b in r["segments"])
        assert "[S]FFF" in "".join(r["tokens"])  # the env's own ansi render, the player in brackets


def test_each_task_has_its_own_map_and_the_demos_walk_shortest_paths_on_maps_never_in_val_or_test(
        example_modules, tmp_path: Path) -> None:
    """gym_frozenlake_warmup.yaml: maps.py gives each task its own map (Gymnasium's
    generate_random_map, seeded by the task); demos.jsonl is what make_demos.py makes: the scripted
    agent's shortest safe paths through the adapter's own workflow, on maps of their own."""
    from ajet.envs import make_env_tasks
    from ajet.envs.demos import yaml_without_sft

    example_modules(HERE, "make_demos", "maps")
    import make_demos

    cfg = yaml_without_sft(HERE / "gym_frozenlake_warmup.yaml").env
    train, val, test = make_env_tasks(cfg)
    maps = {split: ["/".join(t.metadata["env"]["args"]["desc"]) for t in tasks]
            for split, tasks in (("train", train), ("val", val), ("test", test))}
    assert len(set(maps["test"])) >= 16 and not set(maps["test"]) & set(maps["train"])
    assert {len(t.metadata["env"]["args"]["desc"]) for t in train} == {4, 5}
    assert train[0].main_query.startswith("[S]")

    shipped = (HERE / "demos.jsonl").read_text()
    assert make_demos.main(out_dir=tmp_path).read_text() == shipped  # regenerated exactly
    rows = [json.loads(line) for line in shipped.splitlines()]
    assert len(rows) >= 200
    held_out = {t.main_query for t in (*val, *test)}
    for row in rows:
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert users[0].removesuffix("\nYour action?") not in held_out
        grid, start = make_demos.read_grid(users[0])
        # the replies are a shortest safe path: as many moves as the breadth-first distance to G
        assert len(replies) == len(users) and all(r in ("left", "down", "right", "up") for r in replies)
        assert replies[0] == make_demos.shortest_move(grid, start)


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_grpo_step_of_the_warmup_yaml_on_maps_of_their_own(one_step) -> None:
    run = one_step(HERE / "gym_frozenlake_warmup.yaml", "pipeline.stages=[]", "pipeline.overrides.sft=null")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0 and metrics["workflow/turns"] == 10  # max_turns: no move named
