"""The math agent, in its three forms (AgentScope ReActAgent, OpenAI SDK, raw HTTP), trains for
one step on the debug backbone; and the variants' calculator tool answers tool calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent
QUESTIONS = {json.loads(line)["question"] for line in (HERE / "train.jsonl").read_text().splitlines()}


@pytest.mark.tutorial
@pytest.mark.integration
@pytest.mark.parametrize("conf", ["math_agent.yaml", "math_agent_openai.yaml", "math_agent_http.yaml"])
def test_one_step(conf: str, one_step) -> None:
    run = one_step(HERE / conf)
    metrics = run.assert_completed()
    # The agent code ran against the gateway without an error, and the math judge scored
    # every episode (a judge or agent failure would be a `rollout/failed/<reason>`).
    assert metrics["rollout/failed"] == 0, {k: v for k, v in metrics.items() if "failed" in k}
    assert metrics["context/calls"] >= metrics["rollout/episodes"]
    assert 0.0 <= metrics["reward/mean"] <= 1.0
    if conf != "math_agent.yaml":
        assert "workflow/tool_calls" in metrics  # the variant's own log_metrics reached the logger
    records = run.records(1)
    assert records and all(r["query"] in QUESTIONS for r in records)
    assert all(any(r["loss_mask"]) for r in records)


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
