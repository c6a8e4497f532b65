"""The verifiers adapter (issue 73): a taskset gives the tasks of each split, the server (in
verifiers' own environment, .venv-verifiers) runs the tools and scores, the model's turns go through
the tuner; the reward is the tasks' weighted rewards, each logged. Three kinds of environment,
written in tests/unit/env_packages: single-turn (vf_single), tools (vf_tools), multi-turn through
a tool (vf_guess). Failures: an unknown taskset, a reward that raises, a server gone."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_envs_reasoning_gym import run_episode

from ajet.config.schema import EnvConfig, EnvType
from ajet.config.tasks import VerifiersEnvConfig
from ajet.envs import make_env_tasks
from ajet.envs.verifiers import EnvWorkflow
from ajet.errors import LaunchError, TaskReaderError
from ajet.launcher import Launcher, free_port
from ajet.service_specs import env_server_specs

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-verifiers" / "bin" / "python"
PACKAGES = Path(__file__).parent / "env_packages"

pytestmark = pytest.mark.skipif(not PYTHON.is_file(), reason="needs verifiers' environment: make env-verifiers")


def reply(text: str = "", *calls: tuple[str, dict]) -> SimpleNamespace:
    blocks: list[dict] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": f"call_{i}", "name": name, "input": args, "raw_input": json.dumps(args)}
               for i, (name, args) in enumerate(calls)]
    return SimpleNamespace(content=blocks)


def scripted(*replies: SimpleNamespace) -> Any:
    seen: list[tuple[list[dict], Any]] = []
    it = iter(replies)

    async def tuner(messages: list[dict], tools: Any = None) -> SimpleNamespace:
        seen.append((json.loads(json.dumps(messages)), tools))
        return next(it)

    tuner.seen = seen  # type: ignore[attr-defined]
    return tuner


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """verifiers' server, started by ajet's launcher as a run starts it (env_server_specs)."""
    port = free_port()
    cfg = EnvConfig(type=EnvType.verifiers, id="vf-single", verifiers=VerifiersEnvConfig(python=str(PYTHON), port=port))
    (name, spec), = env_server_specs(cfg).items()
    spec.env = {"PYTHONPATH": str(PACKAGES), "AJET_ENV_TOKEN": "t0ken"}
    os.environ["AJET_ENV_TOKEN"] = "t0ken"
    try:
        with Launcher(env_services={name: spec}):
            yield f"http://127.0.0.1:{port}"
    finally:
        os.environ.pop("AJET_ENV_TOKEN", None)


def env(url: str, taskset: str, **kw: Any) -> EnvConfig:
    fields = {"train_size": 4, "val_size": 2, "test_size": 2, "max_turns": 4, **kw}
    verifiers = fields.pop("verifiers", {})
    return EnvConfig(type=EnvType.verifiers, id=taskset, verifiers=VerifiersEnvConfig(url=url, **verifiers), **fields)


def play(task: Any, *replies: SimpleNamespace) -> tuple[Any, list]:
    tuner = scripted(*replies)
    return asyncio.run(EnvWorkflow().execute(task, tuner)), tuner.seen


def test_the_taskset_gives_disjoint_splits_and_the_prompt(server: str) -> None:
    train, val, test = make_env_tasks(env(server, "vf-single"))
    assert [t.main_query for t in train] == [f"What is {i} + {i + 1}?" for i in range(4)]
    assert [t.main_query for t in (*val, *test)] == [f"What is {i} + {i + 1}?" for i in range(4, 8)]
    assert train[0].init_messages == [{"role": "system", "content": "Answer with the number only."},
                                      {"role": "user", "content": "What is 0 + 1?"}]
    assert train[0].task_id == "vf-single-train-0" and train[0].env_type == "verifiers"
    # eval_args: val and test from the taskset under other arguments (its eval split)
    _, val, test = make_env_tasks(env(server, "vf-single", args={"count": 10},
                                      verifiers={"eval_args": {"offset": 100}}))
    assert [t.main_query for t in (*val, *test)] == [f"What is {i} + {i + 1}?" for i in range(100, 104)]


def test_single_turn_reward_is_the_weighted_rewards_each_logged(server: str) -> None:
    task = make_env_tasks(env(server, "vf-single"))[0][2]  # 2 + 3
    out, seen = play(task, reply("5"))
    assert out.reward == pytest.approx(1.0)  # right 1 x 0.8 + short 1 x 0.2
    assert out.log_metrics == {"turns": 1.0, "tool_calls": 0.0, "completed": 1.0, "reward_right": 1.0,
                               "reward_short": 1.0, "metric_length": 1.0}
    assert out.metadata["rewards"] == {"right": {"score": 1.0, "weight": 0.8}, "short": {"score": 1.0, "weight": 0.2}}
    assert seen == [(task.init_messages, None)]  # no tools
    wrong, _ = play(task, reply("it is six"))
    assert wrong.reward == 0.0 and wrong.log_metrics["metric_length"] == 9.0


def test_tools_run_in_the_server_and_their_results_come_back(server: str) -> None:
    task = make_env_tasks(env(server, "vf-tools"))[0][1]  # 1 + 2
    out, seen = play(task, reply("", ("add", {"a": 1, "b": 2})), reply("", ("fail", {})), reply("3"))
    assert out.reward == 1.0 and out.log_metrics["tool_calls"] == 2.0 and out.log_metrics["metric_used_tools"] == 2.0
    tools = seen[0][1]
    assert [t["function"]["name"] for t in tools] == ["add", "fail"]
    assert tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    second = seen[1][0]
    assert second[-2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert second[-1] == {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "3"}
    # A tool that raises: its error is the model's to read, the episode goes on.
    assert seen[2][0][-1]["content"] == "Error: RuntimeError: the calculator is broken"
    # Each call extends the last: the episode's calls merge into one sample.
    assert seen[1][0][: len(seen[0][0])] == seen[0][0] and seen[2][0][: len(seen[1][0])] == seen[1][0]


def test_multi_turn_the_environment_answers_each_guess(server: str) -> None:
    task = make_env_tasks(env(server, "vf-guess", max_turns=5))[0][0]
    out, seen = play(task, *(reply("", ("guess", {"number": n})) for n in (3, 8, 6)), reply("Found it: 6"))
    assert [s[0][-1]["content"] for s in seen[1:]] == ["higher", "lower", "right"]
    assert out.reward == pytest.approx(1.0 - 0.3) and out.log_metrics["reward_guesses"] == 3.0
    cut, seen = play(task, *(reply("", ("guess", {"number": 0})) for _ in range(5)))
    assert len(seen) == 5 and cut.log_metrics["completed"] == 0.0 and cut.reward == pytest.approx(-0.5)


def test_an_unknown_taskset_or_bad_args_stop_before_the_run(server: str) -> None:
    with pytest.raises(TaskReaderError, match="'vf-nope' is not installed"):
        make_env_tasks(env(server, "vf-nope"))
    with pytest.raises(TaskReaderError, match="count"):
        make_env_tasks(env(server, "vf-single", args={"count": "many"}))
    with pytest.raises(TaskReaderError, match="cannot reach the environment server.*make env-verifiers"):
        make_env_tasks(env(f"http://127.0.0.1:{free_port()}", "vf-single"))


def test_a_reward_that_raises_or_a_server_gone_fails_the_episode_not_the_run(server: str) -> None:
    task = make_env_tasks(env(server, "vf-tools"))[0][0]
    episode = run_episode(EnvWorkflow(), task, scripted(reply("break the scorer")))
    assert (episode.status, episode.reason) == ("failed", "workflow_error:EnvError")
    assert "the scorer broke" in episode.error_message
    gone = task.model_copy(update={"metadata": {"env": {**task.metadata["env"], "url": f"http://127.0.0.1:{free_port()}"}}})
    episode = run_episode(EnvWorkflow(), gone, scripted(reply("1")))
    # A connection refused is the infrastructure's: the runner tried it again, then counted it failed.
    assert (episode.status, episode.reason) == ("failed", "infrastructure:EnvError")


def test_a_token_is_needed(server: str) -> None:
    import httpx

    assert httpx.post(f"{server}/list_tasks", json={"env_type": "vf-single"}).status_code == 401


def test_without_its_environment_the_run_names_the_make_target() -> None:
    cfg = EnvConfig(type=EnvType.verifiers, id="x", verifiers=VerifiersEnvConfig(python="/nowhere/python"))
    with pytest.raises(LaunchError, match="make env-verifiers"):
        env_server_specs(cfg)


@pytest.mark.integration
def test_one_training_step_on_the_tiny_model(server: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    from test_envs_train import train_one_step

    step = train_one_step(tmp_path, tiny_model_dir, "env.type=verifiers", "env.id=vf-single",
                          f"env.verifiers.url={server}", "env.max_turns=1")
    assert step["context/calls"] == 4 and "workflow/reward_right" in step and "workflow/reward_short" in step
