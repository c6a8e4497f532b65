"""The OpenEnv adapter (issue 73): a server started by ajet's launcher from its package's ASGI app
(in OpenEnv's own environment, .venv-openenv), driven through OpenEnv's WebSocket protocol, one
session per episode; the reward is the steps' rewards. The environment is a counting game written
in tests/unit/env_packages/oe_count. A server killed mid-run fails the episode in flight; the
launcher starts it again and the next episode runs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_envs_reasoning_gym import run_episode, scripted

from ajet.config.schema import EnvConfig, EnvType
from ajet.config.tasks import OpenEnvEnvConfig
from ajet.envs import make_env_tasks
from ajet.envs.openenv import EnvWorkflow, action_field, parse_action
from ajet.errors import LaunchError, TaskReaderError
from ajet.launcher import Launcher, answers_2xx, free_port
from ajet.service_specs import env_server_specs

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-openenv" / "bin" / "python"
PACKAGES = Path(__file__).parent / "env_packages"

needs_env = pytest.mark.skipif(not PYTHON.is_file(), reason="needs OpenEnv's environment: make env-openenv")


def count_env(port: int) -> EnvConfig:
    return EnvConfig(type=EnvType.openenv, id="count", train_size=3, val_size=1, test_size=1, max_turns=4,
                     openenv=OpenEnvEnvConfig(app="oe_count:app", python=str(PYTHON), port=port))


@pytest.fixture(scope="module")
def launched() -> Iterator[tuple[Launcher, EnvConfig]]:
    cfg = count_env(free_port())
    (name, spec), = env_server_specs(cfg).items()
    spec.env = {"PYTHONPATH": str(PACKAGES)}
    with Launcher(env_services={name: spec}) as launcher:
        yield launcher, cfg


def play(task: Any, *replies: str) -> tuple[Any, list]:
    tuner = scripted(*replies)
    return asyncio.run(EnvWorkflow().execute(task, tuner)), tuner.seen


@needs_env
def test_tasks_are_seeded_resets_and_the_reply_fills_the_actions_text(launched: tuple) -> None:
    _, cfg = launched
    train, val, test = make_env_tasks(cfg)
    seeds = [t.metadata["env"]["seed"] for t in (*train, *val, *test)]
    assert seeds == [0, 1, 2, 1_000_000, 2_000_000]
    assert train[0].metadata["env"]["action_field"] == "message"  # the action's only string field
    out, seen = play(train[2], "3", "four", "4", "5")  # seed 2: counts on from 2
    assert (out.reward, out.is_success) == (3.0, True)
    assert out.step_rewards == [1.0, 0.0, 1.0, 1.0]
    assert out.log_metrics == {"turns": 4.0, "invalid_moves": 0.0, "return": 3.0, "done": 1.0}
    assert '"last": 2' in seen[0][-1]["content"] and seen[0][0]["role"] == "system"
    assert all(seen[i + 1][: len(seen[i])] == seen[i] for i in range(3))  # one growing conversation


@needs_env
def test_each_episode_has_its_own_session(launched: tuple) -> None:
    _, cfg = launched
    first, second = make_env_tasks(cfg)[0][:2]

    async def both() -> list:
        return await asyncio.gather(EnvWorkflow().execute(first, scripted("1", "2", "3")),
                                    EnvWorkflow().execute(second, scripted("2", "3", "9", "4")))

    a, b = asyncio.run(both())
    assert (a.reward, b.reward) == (3.0, 3.0)  # neither saw the other's numbers


@needs_env
def test_an_environment_that_raises_fails_the_episode_not_the_run(launched: tuple) -> None:
    _, cfg = launched
    task = make_env_tasks(cfg)[0][0]
    episode = run_episode(EnvWorkflow(), task, scripted("1", "crash"))
    assert (episode.status, episode.reason) == ("failed", "workflow_error:EnvError")
    assert "the counting game crashed" in episode.error_message


@needs_env
def test_a_killed_server_fails_the_episode_in_flight_and_is_restarted(launched: tuple) -> None:
    launcher, cfg = launched
    task = make_env_tasks(cfg)[0][0]
    url = task.metadata["env"]["url"]
    replies = iter(["1", "2", "3"])

    async def killing_tuner(messages: list[dict], tools: Any = None) -> SimpleNamespace:
        if len(messages) == 4:  # the second call: kill the server under the episode
            os.killpg(os.getpgid(launcher.children[-1].proc.pid), signal.SIGKILL)
            time.sleep(0.3)
        return SimpleNamespace(content=[{"type": "text", "text": next(replies)}])

    episode = run_episode(EnvWorkflow(), task, killing_tuner)
    assert (episode.status, episode.reason) == ("failed", "workflow_error:EnvError")
    deadline = time.monotonic() + 60
    while not (launcher.restarts and answers_2xx(f"{url}/health")):
        assert time.monotonic() < deadline, "the launcher did not start the server again"
        time.sleep(0.2)
    out, _ = play(task, "1", "2", "3")  # the run goes on
    assert out.reward == 3.0


def test_replies_as_actions() -> None:
    assert parse_action("say 5", "message") == {"message": "say 5"}
    assert parse_action('I pick {"x": 1, "y": 2} now', "") == {"x": 1, "y": 2}
    assert parse_action("no json here", "") is None
    schema = {"properties": {"message": {"type": "string"}, "metadata": {"type": "object"}}}
    assert action_field(schema, "") == "message"
    assert action_field({"properties": {"x": {"type": "integer"}, "y": {"type": "string"}}}, "") == ""
    with pytest.raises(TaskReaderError, match="has the fields message"):
        action_field(schema, "text")


def test_no_server_or_no_environment_says_what_to_do() -> None:
    cfg = EnvConfig(type=EnvType.openenv, id="count", openenv=OpenEnvEnvConfig(url=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(TaskReaderError, match="env.openenv.app"):
        make_env_tasks(cfg)
    with pytest.raises(LaunchError, match="make env-openenv"):
        env_server_specs(EnvConfig(type=EnvType.openenv, id="c", openenv=OpenEnvEnvConfig(app="a:app", python="/no")))


@needs_env
@pytest.mark.integration
def test_one_training_step_on_the_tiny_model(launched: tuple, tmp_path: Path, tiny_model_dir: Path) -> None:
    from test_envs_train import train_one_step

    _, cfg = launched
    step = train_one_step(tmp_path, tiny_model_dir, "env.type=openenv", "env.id=count",
                          f"env.openenv.url=http://127.0.0.1:{cfg.openenv.port}", "env.max_turns=2")
    assert 1 <= step["workflow/turns"] <= 2
