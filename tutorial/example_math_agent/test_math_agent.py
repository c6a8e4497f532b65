"""The math agent, in its three forms (AgentScope ReActAgent, OpenAI SDK, raw HTTP), trains for
one step on the debug backbone; and the variants' calculator tool answers tool calls."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent
QUESTIONS = {json.loads(line)["question"] for line in (HERE / "train.jsonl").read_text().splitlines()}


@pytest.mark.tutorial
@pytest.mark.integration
# math_agent.yaml (AgentScope) is a pipeline with an SFT stage of its own learning rate:
# test_the_demo_pipeline_and_its_summary runs it.
@pytest.mark.parametrize("conf", ["math_agent_openai.yaml", "math_agent_http.yaml"])
def test_one_step(conf: str, one_step) -> None:
    run = one_step(HERE / conf)
    metrics = run.assert_completed()
    # The agent code ran against the gateway without an error, and the math judge scored
    # every episode (a judge or agent failure would be a `rollout/failed/<reason>`).
    assert metrics["rollout/failed"] == 0, {k: v for k, v in metrics.items() if "failed" in k}
    assert metrics["context/calls"] >= metrics["rollout/episodes"]
    assert 0.0 <= metrics["reward/mean"] <= 1.0
    # tool use is counted from the tracker's records, whatever the agent's framework
    assert 0.0 <= metrics["agent/tool_call_rate"] <= 1.0 and metrics["agent/calls_per_episode"] >= 1.0
    assert "workflow/tool_calls" in metrics  # the variant's own log_metrics reached the logger
    records = run.records(1)
    assert records and all(r["query"] in QUESTIONS for r in records)
    assert all(any(r["loss_mask"]) for r in records)


@pytest.mark.tutorial
@pytest.mark.integration
def test_grpo_alone_starts_on_the_one_step_tasks(one_step) -> None:
    """math_agent_rl.yaml (target b): its curriculum gives GRPO the easiest third of train first."""
    # (without dynamic sampling: the random tiny model never succeeds, so no group would be kept)
    run = one_step(HERE / "math_agent_rl.yaml", "pipeline.stages=[]", "rollout.dynamic_sampling.enabled=false",
                   "rollout.max_tokens=48")  # room for the forced call's markup (~16 tokens)
    metrics = run.assert_completed()
    assert metrics["data/curriculum_pool"] == pytest.approx(0.33)
    rows = [json.loads(line) for line in (HERE / "train.jsonl").read_text().splitlines()]
    easy = {r["question"] for r in rows if r["difficulty"] == 1}
    records = run.records(1)
    assert records and all(r["query"] in easy for r in records)


def test_calculator_tool_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    from calculator_tool import run_tool_call

    def call(name: str, arguments: str) -> dict:
        return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}

    assert run_tool_call(call("calculate", json.dumps({"expression": "12 * (3 + 4)"}))) == "84"
    assert run_tool_call(call("calculate", json.dumps({"expression": "7 / 2"}))) == "3.5"
    assert run_tool_call(call("calculate", json.dumps({"expression": "__import__('os')"}))).startswith("error")
    assert run_tool_call(call("calculate", "not json")).startswith("error: bad arguments")
    assert run_tool_call(call("calculate", "{}")).startswith("error: bad arguments")
    assert "unknown tool" in run_tool_call(call("search", "{}"))


def test_the_agentscope_tool_is_the_calculators_spec(example_modules) -> None:
    """math_agent.calculate's signature and docstring, as AgentScope turns them into the tool's
    spec, are calculator_tool's spec with the expression's pattern (the one copy: the remote agent
    offers that one)."""
    from agentscope.tool import Toolkit

    example_modules(HERE, "math_agent", "calculator_tool")
    import calculator_tool
    import math_agent

    toolkit = Toolkit()
    toolkit.register_tool_function(math_agent.calculate)
    assert toolkit.get_json_schemas() == [calculator_tool.CALCULATE_TOOL_WITH_PATTERN]


def _load(name: str) -> Any:
    """This tutorial's `name.py` under a module name of its own (other tutorials have a make_data.py too)."""
    spec = importlib.util.spec_from_file_location(f"example_math_agent_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# That make_data.py (and make_demos.py through it) writes these files again byte for byte is
# tests/unit/test_tutorial_index.py's test_make_data_regenerates_the_shipped_data, for every
# tutorial with a make_data.py (it ran twice for this one: ~25 s of the suite).


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / name).read_text().splitlines()]


def test_val_and_test_are_held_out_and_need_the_calculator() -> None:
    train, val, test = read("train.jsonl"), read("val.jsonl"), read("test.jsonl")
    assert len(val) == 32 and not {t["question"] for t in val} & QUESTIONS
    assert len(test) == 32 and not {t["question"] for t in test} & (QUESTIONS | {t["question"] for t in val})
    make_data = _load("make_data")
    for task in train + val + test:
        # an operation on two-digit numbers at least, or one on three-digit numbers: not mental arithmetic
        assert re.search(r"\b\d\d\)? \* \d\d\b|\d{3}", task["expression"]), task
        assert task["answer"] == str(make_data.evaluate(task["expression"]))
        assert task["difficulty"] == make_data.difficulty(task["expression"]) >= 1  # what the curriculum orders by
    demos = read("demos.jsonl")
    asked = {m["content"][0]["text"] for d in demos for m in d["messages"] if m["role"] == "user"}
    assert asked <= QUESTIONS  # demonstrations come from the train split only


def test_train_has_many_templates_and_test_others() -> None:
    """Train mixes products, sums, differences, prices and two-step problems; test asks in
    phrasings train never shows and needs operations train never needs (/ and parentheses)."""
    train, test = read("train.jsonl"), read("test.jsonl")
    train_kinds = {t["kind"] for t in train}
    assert {"mul", "add", "used", "price", "change", "gain_loss"} <= train_kinds
    assert not train_kinds & {t["kind"] for t in test}
    assert {1, 2, 3} <= {t["difficulty"] for t in train}
    assert not any(op in t["expression"] for t in train for op in ("/", "("))
    assert any("/" in t["expression"] for t in test) and any("(" in t["expression"] for t in test)


def test_demos_call_the_tool_then_copy_its_result() -> None:
    for line in (HERE / "demos.jsonl").read_text().splitlines():
        dialog = json.loads(line)
        system, user, call, result, answer = dialog["messages"]
        (tool_call,) = call["tool_calls"]
        assert tool_call["function"]["name"] == "calculate"
        assert result["role"] == "tool" and result["tool_call_id"] == tool_call["id"]
        assert answer == {"role": "assistant", "content": f"\\boxed{{{result['content']}}}"}


@pytest.mark.tutorial
@pytest.mark.integration
def test_the_demo_pipeline_and_its_summary(one_step) -> None:
    """`make demo`'s pipeline, shrunk (8 demonstrations, 4 val tasks, one GRPO step), then
    `ajet summary` on its run dir."""
    run = one_step(HERE / "math_agent.yaml", "sft.coreset.size=8", "eval.max_tasks=4")
    assert run.returncode == 0, run.stderr[-4000:]
    stages = json.loads((run.run_dir / "pipeline.json").read_text())["stages"]
    assert [s["stage"] for s in stages] == ["eval", "sft", "grpo", "eval"]
    metrics_file = Path(stages[2]["run_dir"]) / "metrics.jsonl"
    (grpo,) = [r for r in map(json.loads, metrics_file.read_text().splitlines()) if r.get("split") == "train"]
    assert grpo["rollout/failed"] == 0 and grpo["agent/calls_per_episode"] >= 1.0  # the AgentScope agent ran
    for stage in (stages[0], stages[3]):
        report = json.loads(Path(stage["eval"]).read_text())
        assert report["split"] == "test" and {e["task_id"] for e in report["episodes"]} <= {f"test-{i}" for i in range(4)}
        assert report["metrics"]["episodes"] == 4 and "agent/tool_call_rate" in report["metrics"]
    summary = subprocess.run([sys.executable, "-m", "ajet.cli.main", "summary", str(run.run_dir)],
                             capture_output=True, text=True, timeout=120, cwd=REPO,
                             env={**os.environ, "COLUMNS": "200"})
    assert summary.returncode == 0, summary.stderr
    # the eval stages run on the test split (eval.split: test): the summary reports test
    assert "01_base" in summary.stdout and "04_grpo" in summary.stdout and "test success" in summary.stdout
    assert f"ajet view {stages[2]['run_dir']} --serve" in summary.stdout
    assert "wall time:" in summary.stdout
