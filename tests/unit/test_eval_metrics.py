"""Evaluation metrics on a fixed set of episode outputs, computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ajet.context.types import LLMCall
from ajet.eval.metrics import (
    EpisodeResult,
    episode_result,
    pass_at_k,
    summarize,
    tool_scores,
    tools_from_calls,
    write_report,
)
from ajet.eval.runner import default_name, metrics_table
from ajet.rollout.episode import Episode
from ajet.workflow import WorkflowOutput, WorkflowTask


def r(task: str, i: int, reward: float, success: bool, calls: int = 1, tools=(), target=None,
      optimal=None, status: str = "ok") -> EpisodeResult:
    return EpisodeResult(task_id=task, episode_id=f"{task}-e{i}", status=status, reward=reward, success=success,
                         calls=calls, tools_used=list(tools), target_tools=target, optimal_steps=optimal)


RESULTS = [
    # task A: 1 of 2 succeed; both should use calculate + search
    r("A", 0, 1.0, True, calls=2, tools=["calculate", "search"], target=["calculate", "search"], optimal=2),
    r("A", 1, 0.0, False, calls=4, tools=["calculate", "calculate", "weather"], target=["calculate", "search"],
      optimal=2),
    # task B: none succeed; no tool expected, one used
    r("B", 0, 0.2, False, calls=1, tools=["search"], target=[]),
    r("B", 1, 0.0, False, calls=0, target=[], status="failed"),
    # task C: both succeed, no tool information
    r("C", 0, 1.0, True, calls=1),
    r("C", 1, 1.0, True, calls=3, optimal=1),
]


def test_pass_at_k_unbiased_estimator() -> None:
    assert pass_at_k(2, 1, 1) == 0.5
    assert pass_at_k(2, 1, 2) == 1.0
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_tool_scores() -> None:
    assert tool_scores(["calculate", "search"], ["calculate", "search"]) == (1.0, 1.0, 1.0)
    p, rec, f1 = tool_scores(["calculate", "calculate", "weather"], ["calculate", "search"])
    assert (p, rec) == (0.5, 0.5) and f1 == pytest.approx(0.5)  # sets: {calculate, weather}
    assert tool_scores(["search"], []) == (0.0, 0.0, 0.0)
    assert tool_scores([], []) == (1.0, 1.0, 1.0)


def test_summary_on_fixed_outputs() -> None:
    m = summarize(RESULTS, k=2)
    assert m["episodes"] == 6 and m["tasks"] == 3 and m["failed"] == 1
    assert m["reward/mean"] == pytest.approx((1 + 0 + 0.2 + 0 + 1 + 1) / 6)
    assert m["success/rate"] == pytest.approx(3 / 6)
    assert m["pass@1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert m["pass@2"] == pytest.approx((1 + 0 + 1) / 3)
    # tool selection over the 4 episodes of tasks with target_tools: A0 1, A1 0.5 (sets
    # {calculate, weather} vs {calculate, search}), B0 0 (a tool where none was wanted),
    # B1 0 (did not finish, although {} vs {} alone would score 1)
    assert m["tool/f1"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
    assert m["tool/precision"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
    assert m["tool/recall"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
    assert m["steps/calls_per_episode"] == pytest.approx(11 / 6)
    # efficiency over episodes with optimal_steps: A0 2/2, A1 2/4, C1 1/3
    assert m["steps/efficiency"] == pytest.approx((1 + 0.5 + 1 / 3) / 3)
    # end to end: A0 (succeeded, used both targets), C0, C1 (no targets); A1 failed the task
    assert m["e2e/success"] == pytest.approx(3 / 6)


def test_no_tool_or_step_metrics_without_task_metadata() -> None:
    m = summarize([r("C", 0, 1.0, True), r("C", 1, 0.0, False)], k=1)
    assert "tool/f1" not in m and "steps/efficiency" not in m and "pass@2" not in m
    assert m["pass@1"] == 0.5 and m["e2e/success"] == 0.5


def call_with_tools(*names: str) -> LLMCall:
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
                  for i, n in enumerate(names)]
    return LLMCall(role="default", prompt_ids=[1], completion_ids=[2], completion_logprobs=[0.0],
                   finish_reason="tool_calls", policy_version=0,
                   response_message={"role": "assistant", "content": None, "tool_calls": tool_calls})


def test_tools_used_come_from_recorded_calls_or_the_workflow() -> None:
    calls = [call_with_tools("calculate"), call_with_tools(), call_with_tools("search", "calculate")]
    assert tools_from_calls(calls) == ["calculate", "search", "calculate"]
    task = WorkflowTask(task_id="t", main_query="q", metadata={"target_tools": ["calculate"], "optimal_steps": 2})
    ep = Episode(episode_id="t-e0", task=task, group_id="t", output=WorkflowOutput(reward=1.0, is_success=True),
                 reward=1.0, is_success=True, num_calls=3)
    res = episode_result(ep, calls)
    assert res.tools_used == ["calculate", "search", "calculate"] and res.target_tools == ["calculate"]
    assert res.optimal_steps == 2 and res.calls == 3 and res.success
    # the replies are kept call by call: the tool calls, and no tool_calls key when there were none
    names = [[c["function"]["name"] for c in r.get("tool_calls", [])] for r in res.replies]
    assert names == [["calculate"], [], ["search", "calculate"]]
    assert res.replies[1] == {"content": ""}
    ep.output = WorkflowOutput(reward=1.0, metadata={"tools_used": ["weather"]})
    assert episode_result(ep, calls).tools_used == ["weather"]  # the workflow's own account wins
    failed = Episode(episode_id="t-e1", task=task, group_id="t", status="failed", reason="timeout", reward=0.7)
    res = episode_result(failed, [])
    assert res.reward == 0.0 and not res.success and res.status == "failed" and res.refused == {}
    failed.refused = {"parallel_tool_calls": 2}  # the gateway's 400s, by field, reach the report
    assert episode_result(failed, []).as_dict()["refused"] == {"parallel_tool_calls": 2}


def test_report_json_names_the_model(tmp_path: Path) -> None:
    path = tmp_path / "eval" / "eval_x.json"
    metrics = summarize(RESULTS, k=2)
    write_report(path, name="x", model="/ckpt/final_model", split="val", n=2, temperature=1.0,
                 metrics=metrics, results=RESULTS)
    data = json.loads(path.read_text())
    assert data["model"] == "/ckpt/final_model" and data["split"] == "val" and data["n"] == 2
    assert data["metrics"]["pass@2"] == metrics["pass@2"] and len(data["episodes"]) == 6
    assert data["episodes"][1]["tools_used"] == ["calculate", "calculate", "weather"]
    table = metrics_table([data, {"name": "y", "model": "/other", "metrics": {"pass@1": 0.25}}])
    assert [c.header for c in table.columns] == ["metric", "x", "y"]
    assert default_name("/runs/a/stages/01_sft/final_model") == "01_sft-final_model"
