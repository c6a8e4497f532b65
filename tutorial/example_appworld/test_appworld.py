"""The env-service agent trains for one step on the debug backbone against the reference env
server (started here on a free port), and drives it: every episode creates, steps, evaluates
and releases its own instance."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@dataclass
class _EnvServer:
    url: str
    hits: Counter[str]  # successful requests per path


@pytest.fixture
def env_server() -> Iterator[_EnvServer]:
    """`ajet.task_reader.env_server` in a thread, counting requests per path."""
    from ajet.task_reader.env_server import create_app, serve_in_thread

    hits: Counter[str] = Counter()
    app = create_app(num_train=8, num_val=2)

    @app.middleware("http")
    async def count(request, call_next):  # noqa: ANN001, ANN202
        response = await call_next(request)
        if response.status_code < 400:
            hits[request.url.path] += 1
        return response

    with serve_in_thread(app) as url:
        yield _EnvServer(url, hits)


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_drives_the_env_server(one_step, env_server: _EnvServer) -> None:
    run = one_step(HERE / "appworld.yaml", f"task_reader.env_service.base_url={env_server.url}")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    episodes = int(metrics["rollout/episodes"])
    hits = env_server.hits
    assert hits["/list_tasks"] >= 1
    assert hits["/create"] == hits["/evaluate"] == hits["/release"] == episodes
    # Every model reply went to the environment as an action.
    assert hits["/step"] == metrics["context/calls"] == metrics["workflow/turns"] * episodes
    # The environment's evaluation is the reward (fraction of keys in their goal state).
    assert 0.0 <= metrics["reward/mean"] <= 1.0
    # Multi-turn: each episode's calls extend one conversation, one sample per episode.
    assert metrics["context/samples"] == metrics["rollout/ok"]
    assert {r["task_id"] for r in run.records(1)} <= {f"kv-train-{i:03d}" for i in range(8)}


def test_demos_reach_the_goal_of_train_tasks_never_val_or_test(example_modules) -> None:  # noqa: ANN001
    """demos.jsonl (the SFT warm-up) is what make_demos.py makes: real workflow dialogs on train
    tasks, one JSON action a reply, that leave the store in its goal state when replayed."""
    import json

    from ajet.task_reader.kv_env import KVStoreEnv, make_task

    example_modules(HERE, "make_demos", "env_agent")
    import make_demos

    shipped = [json.loads(line) for line in (HERE / "demos.jsonl").read_text().splitlines()]
    assert len(shipped) == 256
    assert make_demos.make(3) == shipped[:3]  # deterministic, and the shipped file is current
    held_out = make_demos.held_out()
    assert len(held_out) == make_demos.NUM_VAL + make_demos.NUM_TEST
    env = KVStoreEnv(num_train=400, num_val=0, num_test=0)
    for dialog in shipped:
        split, index = dialog["id"].removeprefix("appworld-kv-").split("-")
        task = make_task(split, int(index))
        assert split == "train" and make_demos.task_key(task) not in held_out
        messages = dialog["messages"]
        assert messages[0]["role"] == "system" and task.instruction in messages[1]["content"]
        episode, _, _ = env.create(task.task_id)
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        for reply in replies:
            json.loads(reply)  # one JSON object, nothing around it
            env.step(episode, reply)
        assert env.evaluate(episode)["is_success"] and replies[-1] == '{"action": "done"}'


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_step_credit_marks_the_store_state(one_step, env_server: _EnvServer) -> None:
    run = one_step(HERE / "appworld_step_credit.yaml", f"task_reader.env_service.base_url={env_server.url}",
                   "pipeline.stages=[]", "pipeline.overrides.sft=null")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    # Every call is marked with the server's state; the tiny random model's replies are no
    # actions, so each task's store stays as it was: one state group per task, all its calls.
    assert metrics["credit/state_marked_share"] == 1.0
    assert metrics["credit/state_grouped_share"] == 1.0
    assert metrics["credit/state_group_size"] == 2 * metrics["rollout/calls_per_episode"]  # rollout.n = 2


def test_the_server_names_the_store_state() -> None:
    from ajet.task_reader.kv_env import KVStoreEnv

    env = KVStoreEnv(num_train=1, num_val=0, num_test=0)
    (task_id,) = env.list_tasks("train")
    first, _, info = env.create(task_id)
    again, _, info_again = env.create(task_id)
    assert info["state"] == info_again["state"]  # the same task starts in the same state
    key = info["keys"][0]
    get, put = json.dumps({"action": "get", "key": key}), json.dumps({"action": "set", "key": key, "value": "x1"})
    assert env.step(first, get)[3]["state"] == info["state"]  # a read leaves the store as it was
    changed = env.step(first, put)[3]["state"]
    assert changed != info["state"]
    assert env.step(again, put)[3]["state"] == changed


def test_the_warmup_config_trains_on_the_demos_and_reports_on_test() -> None:
    from ajet.config import load_config

    cfg = load_config(HERE / "appworld_warmup.yaml")
    assert list(cfg.pipeline.stages) == ["eval", "sft", "grpo", "eval"]
    assert cfg.eval.split.value == "test" and cfg.task_reader.env_service.num_test_tasks > 0
    assert Path(cfg.sft.train_path).resolve() == (HERE / "demos.jsonl").resolve()
