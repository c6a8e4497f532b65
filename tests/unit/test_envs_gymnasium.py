"""The Gymnasium adapter (issue 73): an environment id gives each split's resets from disjoint
seeds; an episode is one model call per step, the reply parsed into an action (none found: a
counted invalid move), up to env.max_turns; the reward is the sum of the env's rewards. An env
that raises or returns a malformed observation or reward fails the episode, never the run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_envs_reasoning_gym import run_episode, scripted

from ajet.config import load_config
from ajet.config.schema import EnvConfig, EnvType, GymnasiumEnvConfig
from ajet.envs import make_env_tasks
from ajet.errors import TaskReaderError

gym = pytest.importorskip("gymnasium", reason="the envs extra: pip install 'ajet[envs]'")
from ajet.envs.gymnasium import EnvWorkflow, parse_action  # noqa: E402 - after the extra's check

LAKE_ACTIONS = ["left", "down", "right", "up"]


def lake(**kw: Any) -> EnvConfig:
    fields = {"id": "FrozenLake-v1", "args": {"is_slippery": False}, "train_size": 3, "val_size": 2,
              "test_size": 1, "max_turns": 8, **kw}
    return EnvConfig(type=EnvType.gymnasium, **fields)


def play(task: Any, *replies: str) -> Any:
    tuner = scripted(*replies)
    return asyncio.run(EnvWorkflow().execute(task, tuner)), tuner.seen


def test_tasks_are_resets_from_disjoint_seeds_with_the_first_observation() -> None:
    train, val, test = make_env_tasks(lake())
    seeds = [t.metadata["env"]["seed"] for t in (*train, *val, *test)]
    assert seeds == [0, 1, 2, 1_000_000, 1_000_001, 2_000_000]
    first = train[0]
    assert first.task_id == "FrozenLake-v1-train-0" and first.env_type == "gymnasium"
    assert first.main_query == "[S]FFF\nFHFH\nFFFH\nHFFG"  # the ansi render, the player's cell in brackets
    spec = first.metadata["env"]
    assert spec["actions"] == ["Move left", "Move down", "Move right", "Move up"]  # from the env's docstring
    assert spec["render_mode"] == "ansi" and spec["max_turns"] == 8


def test_an_episode_walks_the_lake_one_call_a_step() -> None:
    task = make_env_tasks(lake())[0][0]
    out, seen = play(task, "right", "I go right", "down", "hmm", "down", "down", "right")
    assert (out.reward, out.is_success) == (1.0, True)
    assert out.metadata["actions"] == ["Move right", "Move right", "Move down", "Move down", "Move down", "Move right"]
    assert out.log_metrics == {"turns": 7.0, "invalid_moves": 1.0, "return": 1.0, "terminated": 1.0, "truncated": 0.0}
    assert out.step_rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert out.step_states == ["0", "1", "2", "6", "6", "10", "14"]  # the observation each call acted on
    # One conversation that grows by a reply and an observation per turn: each call extends the last.
    assert len(seen) == 7 and all(seen[i + 1][: len(seen[i])] == seen[i] for i in range(6))
    assert seen[0][0]["role"] == "system" and "Move left, Move down" in seen[0][0]["content"]
    assert seen[4][-1]["content"].startswith("No action found in your reply")
    assert "S[F]FF" in seen[1][-1]["content"] and seen[1][-1]["content"].endswith("Your action?")


def test_a_hole_ends_the_episode_and_max_turns_cuts_it() -> None:
    task = make_env_tasks(lake())[0][0]
    hole, _ = play(task, "right", "down")  # (1, 1) is a hole
    assert (hole.reward, hole.is_success, hole.log_metrics["terminated"]) == (0.0, False, 1.0)
    short = make_env_tasks(lake(max_turns=3))[0][0]
    cut, seen = play(short, "up", "up", "up")
    assert len(seen) == 3 and cut.log_metrics["terminated"] == 0.0 and cut.reward == 0.0


def test_actions_named_in_the_yaml_and_the_parser() -> None:
    task = make_env_tasks(lake(gymnasium=GymnasiumEnvConfig(actions=LAKE_ACTIONS)))[0][0]
    assert task.metadata["env"]["actions"] == LAKE_ACTIONS
    names = ["Move south (down)", "Move north (up)", "Move east (right)", "Move west (left)",
             "Pickup passenger", "Drop off passenger"]
    assert parse_action("Going south.", names) == 0
    assert parse_action("I will pick up... no: PICKUP", names) == 4
    assert parse_action("left, then right", names) == 2  # the last one named
    assert parse_action("move passenger", names) is None  # words every or two names share
    assert parse_action("2", ["0", "1", "2"]) == 2  # names that are numbers
    with pytest.raises(TaskReaderError, match="names 2 actions; FrozenLake-v1 has 4"):
        make_env_tasks(lake(gymnasium=GymnasiumEnvConfig(actions=["a", "b"])))


def test_an_env_without_ansi_shows_its_observation() -> None:
    blackjack = EnvConfig(type=EnvType.gymnasium, id="Blackjack-v1", train_size=2, val_size=0, test_size=0)
    task = make_env_tasks(blackjack)[0][0]
    assert task.main_query.startswith("Observation: [") and task.metadata["env"]["actions"] == ["Stick", "Hit"]
    out, _ = play(task, "stick")
    assert out.log_metrics["terminated"] == 1.0 and out.reward in (-1.0, 0.0, 1.0)


def test_a_renderer_named_in_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "show.py").write_text("def cell(observation, env):\n    return f'you are on cell {observation}'\n")
    conf = tmp_path / "run.yaml"
    conf.write_text("env: {type: gymnasium, id: FrozenLake-v1, args: {is_slippery: false}, train_size: 1,"
                    " val_size: 0, test_size: 0, max_turns: 2, gymnasium: {renderer: show.py:cell}}\n")
    cfg = load_config(conf)
    task = make_env_tasks(cfg.env)[0][0]
    assert task.main_query == "you are on cell 0"
    _, seen = play(task, "right", "left")
    assert seen[1][-1]["content"].startswith("You chose Move right; reward 0.\nyou are on cell 1")


def test_an_unknown_id_lists_the_installed_and_a_continuous_space_is_refused() -> None:
    with pytest.raises(TaskReaderError, match=r"'Taxi-v3' is not a Gymnasium environment .*Did you mean Taxi-v4"):
        make_env_tasks(lake(id="Taxi-v3", args={}))
    with pytest.raises(TaskReaderError, match=r"Box\(.*only Discrete action spaces"):
        make_env_tasks(lake(id="MountainCarContinuous-v0", args={}))
    with pytest.raises(TaskReaderError, match="gym.make raised TypeError"):
        make_env_tasks(lake(args={"slippery": False}))


# ------------------------------------------------------------------ environments that misbehave


class Broken(gym.Env):
    """A 2-state env whose second step does what `mode` says: raise, a NaN reward, an
    observation outside its space, or a 3-tuple."""

    metadata = {"render_modes": []}

    def __init__(self, mode: str = "raise") -> None:
        self.mode = mode
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Discrete(2)
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return 0, {}

    def step(self, action: int) -> Any:
        self.steps += 1
        if self.steps < 2:
            return 1, 0.5, False, False, {}
        if self.mode == "raise":
            raise RuntimeError("the simulator crashed")
        if self.mode == "nan":
            return 1, float("nan"), False, False, {}
        if self.mode == "observation":
            return 7, 0.0, False, False, {}
        return 1, 0.0, False  # a tuple of the old gym API


@pytest.fixture
def broken_env() -> Iterator[str]:
    env_id = "AjetBrokenEnv-v0"
    gym.register(id=env_id, entry_point=Broken, disable_env_checker=True)
    yield env_id
    del gym.envs.registry[env_id]


@pytest.mark.parametrize(("mode", "says"), [
    ("raise", "step(1) raised RuntimeError: the simulator crashed"),
    ("nan", "returned the reward nan: not a finite number"),
    ("observation", "returned the observation 7, which is not in its observation space Discrete(2)"),
    ("tuple", "step(1) raised ValueError"),
])
def test_an_env_that_misbehaves_fails_the_episode_not_the_run(broken_env: str, mode: str, says: str) -> None:
    cfg = EnvConfig(type=EnvType.gymnasium, id=broken_env, args={"mode": mode}, train_size=1, val_size=0,
                    test_size=0)
    task = make_env_tasks(cfg)[0][0]
    assert task.metadata["env"]["actions"] == ["0", "1"]  # no docstring: the numbers
    episode = run_episode(EnvWorkflow(), task, scripted("1", "1", "1"))
    assert (episode.status, episode.reason) == ("failed", "workflow_error:EnvError")
    assert says in episode.error_message


def test_task_args_give_each_task_its_own_map(tmp_path: Path) -> None:
    """`env.gymnasium.task_args`: a function of the task's seed gives its own gym.make arguments
    (a map), carried in the task's metadata, so the episode plays that map wherever it runs."""
    (tmp_path / "maps.py").write_text(
        "def by_seed(seed):\n"
        "    if seed == 1_000_001:\n"
        "        return {'desc': ['SFF', 'FFF', 'FFG']}\n"
        "    return {'desc': ['SFF', 'FHF', 'FFG'] if seed % 2 else ['SHF', 'FFF', 'HFG']}\n"
        "def broken(seed):\n    raise ValueError('no map for ' + str(seed))\n"
        "def not_a_dict(seed):\n    return ['SFFG']\n"
        "def a_set(seed):\n    return {'desc': {'SF', 'FG'}}\n")
    conf = tmp_path / "run.yaml"

    def tasks(function: str) -> Any:
        conf.write_text("env: {type: gymnasium, id: FrozenLake-v1, args: {is_slippery: false}, train_size: 2,"
                        f" val_size: 2, test_size: 0, max_turns: 6, gymnasium: {{task_args: maps.py:{function}}}}}\n")
        return make_env_tasks(load_config(conf).env)

    train, val, _ = tasks("by_seed")
    assert [t.main_query for t in train] == ["[S]HF\nFFF\nHFG", "[S]FF\nFHF\nFFG"]  # seeds 0 and 1
    # val's seed 1e6 has seed 0's map: left out (a held-out split holds no train map); 1e6 + 1 has its own
    assert [t.metadata["env"]["args"] for t in val] == [{"is_slippery": False, "desc": ["SFF", "FFF", "FFG"]}]
    assert val[0].task_id == "FrozenLake-v1-val-1" and val[0].metadata["env"]["seed"] == 1_000_001
    out, _ = play(train[0], "down", "right", "right", "down")
    assert (out.reward, out.is_success) == (1.0, True)  # the walk of seed 0's map, not FrozenLake's own 4x4
    out, _ = play(train[1], "right", "down")  # seed 1's map: (0, 1) is ice, (1, 1) a hole
    assert out.reward == 0.0 and out.log_metrics["turns"] == 2.0 and out.log_metrics["terminated"] == 1.0
    with pytest.raises(TaskReaderError, match=r"task_args=.*maps.py:broken raised ValueError for seed 0: no map"):
        tasks("broken")
    with pytest.raises(TaskReaderError, match=r"returned \['SFFG'\] for seed 0: it must return a dict"):
        tasks("not_a_dict")
    with pytest.raises(TaskReaderError, match="which the task's metadata cannot hold"):
        tasks("a_set")
