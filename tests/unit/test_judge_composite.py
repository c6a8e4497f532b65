"""`composite` judge: weighted components, penalties, success rule, logged breakdown."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from ajet.config.schema import JudgeConfig
from ajet.judge import JudgeError, build_judge
from ajet.judge.composite import tool_selection_f1
from ajet.workflow import WorkflowOutput, WorkflowTask

PARAMS = {
    "components": {
        "answer": {"weight": 0.5, "type": "task_completion", "judge": {"type": "math"}},
        "tools": {"weight": 0.2, "type": "tool_selection_f1"},
        "steps": {"weight": 0.2, "type": "step_efficiency"},
        "format": {"weight": 0.1, "type": "format_compliance", "pattern": r"^\d+$"},
    },
    "penalties": {"timeout": -0.5, "format_error": -0.2},
}
TASK = WorkflowTask(task_id="t", main_query="q", metadata={
    "answer": "42", "target_tools": ["search", "calculator"], "optimal_steps": 2,
})


def score(metadata: dict, params: dict = PARAMS, task: WorkflowTask = TASK) -> tuple[WorkflowOutput, tuple]:
    output = WorkflowOutput(metadata=metadata)
    return output, build_judge(JudgeConfig(type="composite", params=params)).compute_reward(task, output)


def test_breakdown_weights_and_total() -> None:
    output, (reward, success) = score({
        "final_answer": "42", "tools_used": ["search", "browser"], "steps": 4,
    })
    # answer 1, tools F1 = 0.5 (P=1/2, R=1/2), steps 2/4 = 0.5, format 1
    assert output.log_metrics["judge/answer"] == 1.0
    assert output.log_metrics["judge/tools"] == pytest.approx(0.5)
    assert output.log_metrics["judge/steps"] == pytest.approx(0.5)
    assert output.log_metrics["judge/format"] == 1.0
    assert reward == pytest.approx(0.5 + 0.2 * 0.5 + 0.2 * 0.5 + 0.1)
    assert output.log_metrics["judge/total"] == pytest.approx(reward)
    assert output.log_metrics["judge/penalty/timeout"] == 0.0
    assert success is True  # the task_completion component succeeded, no penalty


def test_penalties_apply_when_flagged() -> None:
    output, (reward, success) = score({
        "final_answer": "42", "tools_used": ["search", "calculator"], "steps": 1, "timeout": True,
    })
    assert reward == pytest.approx(1.0 - 0.5)
    assert output.log_metrics["judge/penalty/timeout"] == -0.5
    assert output.log_metrics["judge/penalty/format_error"] == 0.0
    assert success is False


def test_wrong_answer_is_not_a_success() -> None:
    output, (reward, success) = score({"final_answer": "41 apples", "tools_used": [], "steps": 9})
    assert output.log_metrics["judge/answer"] == 0.0 and output.log_metrics["judge/format"] == 0.0
    assert reward == pytest.approx(0.2 * 2 / 9)
    assert success is False


def test_success_threshold_and_metric_only_rule() -> None:
    partial = {"final_answer": "42", "tools_used": ["search"], "steps": 2}  # tools F1 = 2/3
    _, (reward, _) = score(partial, {**PARAMS, "success_threshold": 0.95})
    assert reward == pytest.approx(0.5 + 0.2 * 2 / 3 + 0.2 + 0.1)
    assert score(partial, {**PARAMS, "success_threshold": 0.95})[1][1] is False
    assert score(partial, {**PARAMS, "success_threshold": 0.9})[1][1] is True
    metric_only = {"components": {"fmt": {"type": "format_compliance"}, "f1": {"type": "tool_selection_f1"}}}
    out, (reward, ok) = score({"format_ok": True, "tools_used": ["search", "calculator"]}, metric_only)
    assert reward == 2.0 and ok is True  # weight defaults to 1
    assert score({"format_ok": False, "tools_used": ["search", "calculator"]}, metric_only)[1][1] is False


def test_task_completion_from_workflow_flags() -> None:
    params = {"components": {"done": {"type": "task_completion"}}}
    assert score({"task_completed": True}, params)[1] == (1.0, True)
    output = WorkflowOutput(is_success=False)
    judge = build_judge(JudgeConfig(type="composite", params=params))
    assert judge.compute_reward(TASK, output) == (0.0, False)
    with pytest.raises(JudgeError, match="'done' \\(task_completion\\) has nothing to score"):
        judge.compute_reward(TASK, WorkflowOutput())


def test_judge_type_components_including_async_llm() -> None:
    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=None)))

    async def create(**kwargs):
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content='{"score": 6}'))])

    client.chat.completions.create = create
    params = {"components": {
        "exact": {"weight": 1.0, "type": "exact_match", "params": {"ignore_punctuation": True}},
        "style": {"weight": 0.5, "type": "llm", "params": {"rubric": "polite?"}},
    }}
    judge = build_judge(JudgeConfig(type="composite", params=params), llm_client_factory=lambda: client)
    output = WorkflowOutput(metadata={"final_answer": "42."})
    reward, success = asyncio.run(judge.acompute_reward(TASK, output))
    assert reward == pytest.approx(1.0 + 0.5 * 0.6)
    assert output.log_metrics["judge/exact"] == 1.0 and output.log_metrics["judge/style"] == pytest.approx(0.6)
    assert success is False  # no task_completion component: needs every component at 1


def test_tool_f1() -> None:
    assert tool_selection_f1([], []) == 1.0
    assert tool_selection_f1(["a"], []) == 0.0
    assert tool_selection_f1(["a", "b", "b"], ["a", "b"]) == 1.0
    assert tool_selection_f1(["a", "b", "c"], ["a"]) == pytest.approx(0.5)  # P=1/3, R=1


@pytest.mark.parametrize("params,message", [
    ({"components": {}}, "components is empty"),
    ({"components": {"x": {"weight": 1}}}, r"components.x.type is required"),
    ({"components": {"x": {"type": "math", "wieght": 1}}}, r"unknown keys \['wieght'\]"),
    ({"components": {"x": {"type": "nope"}}}, "judge.type 'nope' is not one of"),
    ({"components": {"x": {"type": "tool_selection_f1", "judge": {"type": "math"}}}},
     "only for task_completion"),
])
def test_config_errors(params: dict, message: str) -> None:
    with pytest.raises(JudgeError, match=message):
        build_judge(JudgeConfig(type="composite", params=params))


def test_missing_metadata_errors() -> None:
    task = WorkflowTask(task_id="bare", metadata={"answer": "1"})
    for comp, needs in [("tool_selection_f1", "target_tools"), ("step_efficiency", "optimal_steps"),
                        ("format_compliance", "format_ok")]:
        judge = build_judge(JudgeConfig(type="composite", params={"components": {"c": {"type": comp}}}))
        with pytest.raises(JudgeError, match=needs):
            judge.compute_reward(task, WorkflowOutput(metadata={}))
