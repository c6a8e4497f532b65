"""FrozenLake trains for one step on the debug backbone, and the tracker merges each episode's
turns into one sample; the environment's rules hold."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture
def env_module(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(HERE))
    import frozenlake_env

    return frozenlake_env


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_merges_turns(one_step) -> None:
    run = one_step(HERE / "frozenlake.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    ok = metrics["rollout/ok"]
    calls = metrics["context/calls"]
    # Several turns per episode (the tiny random model never finds a move, so it walks
    # until max_steps), all extending one timeline: one sample per episode.
    assert metrics["rollout/calls_per_episode"] > 1
    assert metrics["workflow/turns"] == metrics["rollout/calls_per_episode"]
    assert calls > metrics["context/samples"] == ok
    assert metrics["context/timelines"] == ok
    records = run.records(1)
    assert len(records) == ok
    # Each record holds every call of its episode: one completion segment per call,
    # all of them trained.
    assert sum(len(r["segments"]) for r in records) == calls
    for r in records:
        assert len(r["segments"]) > 1
        for start, end in r["segments"]:
            assert all(r["loss_mask"][start:end])
        assert sum(r["loss_mask"]) == sum(end - start for start, end in r["segments"])


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_step_credit(one_step) -> None:
    # deterministic: one request at a time, each with its own seed, so the random model samples the
    # same replies whatever else loads the machine (under load, batching once made it name a move)
    run = one_step(HERE / "frozenlake_step_credit.yaml", "pipeline.stages=[]", "pipeline.overrides.sft=null",
                   "trainer.deterministic=true", "rollout.max_concurrency=1")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    # the start checks the chat template's message shapes (the tiny model has the bundled one)
    assert "chat template: prefix-preserving for system prompts" in run.stderr
    # The tiny random model names no move, so every call of every rollout acts at S: one state
    # group per map, holding all its calls.
    assert metrics["credit/state_marked_share"] == 1.0
    assert metrics["credit/state_grouped_share"] == 1.0
    assert metrics["credit/state_group_size"] == 2 * metrics["rollout/calls_per_episode"]  # rollout.n = 2


def test_maps_are_deterministic_and_solvable(env_module) -> None:
    for seed in range(20):
        rows = env_module.generate_map(4, seed)
        assert rows == env_module.generate_map(4, seed)
        assert rows[0][0] == "S" and rows[-1][-1] == "G" and env_module.has_path(rows)
    assert env_module.generate_map(4, 0) != env_module.generate_map(4, 1)
    assert not env_module.has_path(["SH", "HG"])


def test_rules(env_module) -> None:
    FrozenLake = env_module.FrozenLake
    env = FrozenLake(["SF", "HG"], max_steps=5)
    assert env.render() == "P F\nH G"
    result = env.step("I will go up")  # the edge: stay
    assert (env.position, result.valid, result.done) == ((0, 0), True, False)
    result = env.step("hmm")  # no move: stay, counted
    assert (env.position, result.valid, env.invalid_moves) == ((0, 0), False, 1)
    result = env.step("left? no: right")  # the last move word counts
    assert env.position == (0, 1) and env.trail == ["up", "right"]
    result = env.step("down")
    assert (result.reward, result.done, env.reached_goal) == (1.0, True, True)
    with pytest.raises(ValueError):
        env.step("down")

    hole = FrozenLake(["SF", "HG"], max_steps=5)
    result = hole.step("Down.")
    assert result.done and result.reward == 0.0 and "hole" in result.observation
    assert not hole.reached_goal

    slow = FrozenLake(["SF", "FG"], max_steps=2)
    slow.step("wait")
    result = slow.step("wait")
    assert result.done and result.reward == 0.0 and "Out of steps" in result.observation


def test_safe_moves_skip_the_edge_and_the_holes(env_module) -> None:
    env = env_module.FrozenLake(["SFF", "HFH", "FFG"], max_steps=9)
    assert env.safe_moves() == ["right"]  # up and left: the edge; down: a hole
    env.step("right")
    assert env.safe_moves() == ["left", "down", "right"]
    env.step("down")
    assert env.safe_moves() == ["down", "up"]  # left and right: holes


def test_safe_moves_agent_lists_them_in_every_observation(example_modules) -> None:  # noqa: ANN001
    """FrozenLakeSafeMovesAgent's observations end with the safe moves of where P stands; the
    grid-only agent's do not."""
    import asyncio
    from types import SimpleNamespace

    example_modules(HERE, "frozenlake_env", "frozenlake")
    import frozenlake

    from ajet import WorkflowTask

    seen: list[str] = []

    async def tuner(messages):  # noqa: ANN001, ANN202
        seen.append(messages[-1]["content"])
        return SimpleNamespace(content=[{"type": "text", "text": ["right", "down"][len(seen) - 1]}])

    task = WorkflowTask(task_id="t", main_query="Reach G.", metadata={"map": ["SF", "HG"], "max_steps": 4})
    output = asyncio.run(frozenlake.FrozenLakeSafeMovesAgent().execute(task, tuner))
    assert output.is_success
    assert seen[0].endswith("P F\nH G\nSafe moves: right.\nYour move?")
    assert seen[1].endswith("S P\nH G\nSafe moves: left, down.\nYour move?")
    seen.clear()
    asyncio.run(frozenlake.FrozenLakeAgent().execute(task, tuner))
    assert "Safe moves" not in seen[0] and seen[0].endswith("P F\nH G\nYour move?")


def test_test_maps_are_held_out_and_solvable(env_module) -> None:
    """test.jsonl (only reported on, never tuned on): no map of train or val, each solvable."""
    import json

    def maps(split: str) -> list[tuple[str, ...]]:
        return [tuple(json.loads(line)["map"]) for line in (HERE / f"{split}.jsonl").read_text().splitlines()]

    test = maps("test")
    assert len(test) == len(set(test)) == 16
    assert not set(test) & (set(maps("train")) | set(maps("val")))
    assert all(env_module.has_path(list(m)) for m in test)


def test_shortest_moves_walk_around_the_holes(env_module) -> None:
    rows = ["SFF", "HHF", "GFF"]
    assert env_module.shortest_moves(rows, (0, 0)) == ["right", "right", "down", "down", "left", "left"]
    assert env_module.shortest_moves(rows, (2, 1)) == ["left"]
    assert env_module.shortest_moves(["SH", "HG"], (0, 0)) == []


def test_demos_walk_shortest_paths_on_maps_never_in_val_or_test(example_modules) -> None:  # noqa: ANN001
    """demos.jsonl (the SFT warm-up) is what make_demos.py makes: real workflow dialogs whose
    replies are one move each, reaching G on a map that is neither a val nor a test map."""
    import json

    example_modules(HERE, "make_data", "make_demos", "frozenlake_env", "frozenlake")
    import frozenlake_env
    import make_demos

    held_out = {"/".join(json.loads(line)["map"]) for split in ("val", "test")
                for line in (HERE / f"{split}.jsonl").read_text().splitlines()}
    shipped = [json.loads(line) for line in (HERE / "demos.jsonl").read_text().splitlines()]
    with_hints = [json.loads(line) for line in (HERE / "demos_safe_moves.jsonl").read_text().splitlines()]
    assert len(shipped) == len(with_hints) == 256
    tasks = make_demos.demo_tasks(4)
    made = [make_demos.asyncio.run(make_demos.demo(t)) for t in tasks]
    assert made == shipped[:4]  # deterministic, and the shipped file is current
    assert [make_demos.asyncio.run(make_demos.demo(t, safe_moves=True)) for t in tasks] == with_hints[:4]
    for dialog, hinted in zip(shipped, with_hints, strict=True):
        # The same walk on the same map; only the observations differ (their safe moves).
        assert [m["content"] for m in hinted["messages"] if m["role"] == "assistant"] == \
            [m["content"] for m in dialog["messages"] if m["role"] == "assistant"]
        assert all("Safe moves: " in m["content"] for m in hinted["messages"] if m["role"] == "user")
    for dialog in shipped:
        messages = dialog["messages"]
        rows, start = make_demos.read_grid(messages[1]["content"])
        assert start == (0, 0) and "/".join(rows) not in held_out
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert replies == frozenlake_env.shortest_moves(rows, start)
        assert messages[-1]["role"] == "assistant"


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_compaction(one_step) -> None:
    """Issue 55 §3: the summary call is trained in the sample of the turns it summarises; the
    turns after each rewrite are a sample of their own that starts from the rewritten prompt and
    names its break; every sample gets its episode's advantage; no call is trained twice."""
    run = one_step(HERE / "frozenlake_compaction.yaml", "pipeline.stages=[]", "pipeline.overrides.sft=null")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    # The tiny random model names no move, so it walks until max_steps: over the budget, always.
    assert metrics["workflow/compactions"] >= 1
    assert metrics["context/breaks/rewrite"] == metrics["context/samples"] - metrics["rollout/ok"] > 0
    records = run.records(1)
    assert len(records) == metrics["context/samples"]
    calls = 0
    for episode in {r["episode_id"] for r in records}:
        samples = [r for r in records if r["episode_id"] == episode]
        assert [r["break"] for r in samples] == ["", *["rewrite"] * (len(samples) - 1)]
        for r in samples:
            text = "".join(r["tokens"])
            if r is not samples[-1]:  # ends with the summary call, trained
                start, end = r["segments"][-1]
                assert "Your notes are full" in "".join(r["tokens"][:start]) and all(r["loss_mask"][start:end])
            if r["break"]:  # starts from the rewritten prompt
                assert "Your notes: " in text and "Your notes are full" not in text.split("Your notes: ")[0]
            trained_advantages = {a for a, m in zip(r["advantages"], r["loss_mask"], strict=True) if m}
            assert len(trained_advantages) == 1  # the episode's one advantage on every trained token
            assert sum(r["loss_mask"]) == sum(end - start for start, end in r["segments"])
            calls += len(r["segments"])
        assert len({(r["advantages"][r["segments"][0][0]]) for r in samples}) == 1
    assert calls == metrics["context/calls"]  # each call trained in exactly one sample
