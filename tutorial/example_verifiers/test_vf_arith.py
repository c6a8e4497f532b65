"""The tutorial's verifiers environment (vf_arith, installed into .venv-verifiers by `make
env-verifiers`): its tasks come from the taskset through ajet's launcher-started server, the right
tool with the question's numbers earns the reward, a wrong one does not, and the YAML trains a GRPO
step on the debug backbone."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ajet.config import load_config
from ajet.envs import make_env_tasks
from ajet.envs.verifiers import EnvWorkflow
from ajet.launcher import Launcher, free_port
from ajet.service_specs import env_server_specs

HERE = Path(__file__).parent
REPO = HERE.parents[1]
PYTHON = REPO / ".venv-verifiers" / "bin" / "python"

pytestmark = pytest.mark.skipif(not PYTHON.is_file(), reason="needs verifiers' environment: make env-verifiers")


@pytest.fixture(scope="module")
def cfg() -> Iterator[Any]:
    """vf_arith.yaml's env, its server started by ajet's launcher as a run starts it."""
    port = free_port()
    env = load_config(HERE / "vf_arith.yaml", [f"env.verifiers.python={PYTHON}", f"env.verifiers.port={port}",
                                               "env.train_size=6", "env.val_size=3", "env.test_size=3"]).env
    (name, spec), = env_server_specs(env).items()
    with Launcher(env_services={name: spec}):
        yield env


def reply(text: str = "", call: tuple[str, dict] | None = None) -> SimpleNamespace:
    blocks: list[dict] = [{"type": "text", "text": text}] if text else []
    if call:
        blocks.append({"type": "tool_use", "id": "call_0", "name": call[0], "input": call[1],
                       "raw_input": json.dumps(call[1])})
    return SimpleNamespace(content=blocks)


def play(task: Any, *replies: SimpleNamespace) -> Any:
    it = iter(replies)

    async def tuner(messages: list[dict], tools: Any = None) -> SimpleNamespace:
        return next(it)

    return asyncio.run(EnvWorkflow().execute(task, tuner))


def test_the_right_tool_with_the_questions_numbers_earns_the_reward(cfg: Any) -> None:
    train, val, test = make_env_tasks(cfg)
    assert (len(train), len(val), len(test)) == (6, 3, 3)
    assert len({t.main_query for t in (*train, *val, *test)}) == 12  # train, then the taskset's next tasks
    assert "calculator" in train[0].init_messages[0]["content"]
    tools = {"sum": "add", "plus": "add", "Add": "add", "minus": "subtract", "difference": "subtract",
             "Subtract": "subtract", "product": "multiply", "times": "multiply", "Multiply": "multiply"}
    for task in train:
        question = task.main_query
        tool = next(t for word, t in tools.items() if word in question)
        a, b = (int(n) for n in re.findall(r"\d+", question)[:2])
        if question.startswith("Subtract"):
            a, b = b, a  # "Subtract b from a."
        result = {"add": a + b, "subtract": a - b, "multiply": a * b}[tool]
        out = play(task, reply("", (tool, {"a": a, "b": b})), reply(f"The answer is {result}."))
        assert out.reward == 1.0 and out.log_metrics["metric_right_tool"] == 1.0, question
        other = "multiply" if tool != "multiply" else "add"
        wrong = {"add": a + b, "subtract": a - b, "multiply": a * b}[other]
        out = play(task, reply("", (other, {"a": a, "b": b})), reply(f"The answer is {wrong}."))
        assert out.log_metrics["metric_right_tool"] == 0.0
        assert out.reward == float(wrong == result), question


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_grpo_step_from_the_yaml(one_step) -> None:
    run = one_step(HERE / "vf_arith.yaml", "pipeline.stages=[]", f"env.verifiers.port={free_port()}",
                   f"env.verifiers.python={PYTHON}",
                   "env.train_size=8", "env.val_size=2", "env.test_size=2")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    assert metrics["workflow/tool_calls"] >= 1.0  # the first call is forced to a tool (first_call_tool_choice)
    assert "workflow/reward_right" in metrics and "workflow/metric_right_tool" in metrics




@pytest.mark.integration
def test_ajet_episode_and_eval_start_the_environments_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`ajet episode` and `ajet eval` on the YAML start verifiers' server as training does (and stop it)."""
    from tests.integration.cli import ajet

    common = [f"model.path={tiny_model_dir}", f"env.verifiers.port={free_port()}", f"env.verifiers.python={PYTHON}",
              "env.train_size=2", "env.val_size=1", "env.test_size=2", "rollout.max_tokens=8"]
    shown = ajet("episode", "--conf", str(HERE / "vf_arith.yaml"), *common, timeout=300)
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    assert "call 1 [" in shown.stdout and "call 2 [" in shown.stdout  # the forced tool call, then the answer
    evaluated = ajet("eval", "--conf", str(HERE / "vf_arith.yaml"), *common, f"project.exp_dir={tmp_path}", "--n", "1",
                     timeout=300)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    report = json.loads(next((tmp_path / "vf_arith" / "eval").glob("*.json")).read_text())
    assert len(report["episodes"]) == 2 and all(e["status"] == "ok" for e in report["episodes"])
    assert (tmp_path / "vf_arith" / "services" / "env-verifiers.log").is_file()
