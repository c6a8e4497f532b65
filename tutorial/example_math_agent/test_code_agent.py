"""The code-writing math agent (code_agent.py): its programs run in the sandbox, its episode
reports what they did, and a program that hangs, floods or escapes is a tool result the model
reads while the episode goes on. One training step on the debug backbone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


def scripted(programs: list[str]) -> Any:
    """An AgentScope chat model that calls run_python with each program in turn, then answers
    the last tool result in \\boxed{}."""
    from agentscope.message import TextBlock, ToolUseBlock
    from agentscope.model import ChatModelBase, ChatResponse

    class Scripted(ChatModelBase):
        def __init__(self) -> None:
            super().__init__(model_name="scripted", stream=False)
            self.results: list[str] = []

        async def __call__(self, messages: list[dict], tools: list[dict] | None = None, **kwargs: Any) -> ChatResponse:
            results = [m for m in messages if m.get("role") == "tool"]
            if len(results) < len(programs):
                code = programs[len(results)]
                return ChatResponse(content=[ToolUseBlock(type="tool_use", id=f"c{len(results)}", name="run_python",
                                                          input={"code": code})])
            content = results[-1]["content"]
            text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
            self.results = [str(r["content"]) for r in results]
            return ChatResponse(content=[TextBlock(type="text", text=f"\\boxed{{{text}}}")])

    return Scripted()


def run_episode(example_modules, programs: list[str], question: str = "What is 12 * 34?") -> tuple[Any, Any]:
    example_modules(HERE, "code_agent")
    from code_agent import CodeAgent

    from ajet import WorkflowTask

    model = scripted(programs)
    task = WorkflowTask(task_id="t", main_query=question, metadata={"answer": "408"})
    return asyncio.run(CodeAgent().execute(task, model)), model


def test_a_program_runs_in_the_sandbox_and_is_counted(example_modules) -> None:
    output, _ = run_episode(example_modules, ["total = 0\nfor box in range(12):\n    total += 34\nprint(total)"])
    assert output.metadata["final_answer"] == "\\boxed{408}"
    metrics = output.log_metrics
    assert metrics["sandbox/calls"] == 1 and metrics["code/valid_rate"] == 1.0
    assert metrics["sandbox/timeouts"] == metrics["sandbox/refused"] == 0


def test_hostile_programs_are_results_and_the_episode_goes_on(example_modules) -> None:
    output, model = run_episode(example_modules, [
        "while True:\n    pass",                        # hangs: stopped by the CPU cap
        "print(open('/etc/shadow').read())",           # escapes: refused
        "print(2 ** 10000)",                           # big integers are fine
    ])
    results = model.results
    assert "time limit" in results[0]
    assert "refused by the sandbox" in results[1] and "root:" not in results[1]
    assert len(results[2]) > 100 or "[cut]" in results[2]
    metrics = output.log_metrics
    assert metrics["sandbox/calls"] == 3
    assert metrics["sandbox/timeouts"] == 1 and metrics["sandbox/refused"] == 1
    assert metrics["code/valid_rate"] == pytest.approx(1 / 3)


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / name).read_text().splitlines()]


def test_the_code_splits_are_the_math_splits_plus_problems_where_code_helps() -> None:
    for split, extra in (("train", 128), ("val", 16), ("test", 16)):
        math_tasks, code_tasks = read(f"{split}.jsonl"), read(f"code_{split}.jsonl")
        assert code_tasks[:len(math_tasks)] == math_tasks and len(code_tasks) == len(math_tasks) + extra
    questions = {split: {t["question"] for t in read(f"code_{split}.jsonl")} for split in ("train", "val", "test")}
    assert not questions["train"] & questions["val"] and not questions["test"] & (questions["train"] | questions["val"])
    train_kinds = {t["kind"] for t in read("code_train.jsonl") if "program" in t}
    test_kinds = {t["kind"] for t in read("code_test.jsonl") if "program" in t}
    assert not train_kinds & test_kinds  # test's problems where code helps are templates of their own
    # what the calculator cannot do: a loop, or a number past what a float holds exactly
    for task in read("code_test.jsonl")[32:]:
        assert "for " in task["program"] or int(task["answer"]) > 2**53, task


def test_the_demos_are_the_workflows_own_dialogs() -> None:
    demos = read("code_demos.jsonl")
    tasks = {f"code_agent-{t['task_id']}": t for t in read("code_train.jsonl")}
    assert [d["id"] for d in demos] == list(tasks)  # every train task, the problems where code helps too
    for demo in demos[:10] + demos[256:266]:
        call = demo["messages"][-3]["tool_calls"][0]["function"]
        task = tasks[demo["id"]]
        assert call["name"] == "run_python"
        program = task.get("program") or f"print({task['expression']})"
        assert json.loads(call["arguments"]) == {"code": program}
        assert demo["messages"][-2]["content"] == task["answer"]  # what the program printed in the sandbox
        assert demo["messages"][-1]["content"] == f"\\boxed{{{task['answer']}}}"


def test_the_heldout_templates_validation_never_trains_on_what_it_validates(example_modules, tmp_path) -> None:
    example_modules(HERE, "heldout_kinds")
    from heldout_kinds import main

    paths = main(tmp_path)
    train, demos, val = (read(paths[name]) for name in ("train", "demos", "val"))
    held = {t["kind"] for t in val}
    assert len(held) == 5 and len(val) == 96
    assert sum("program" in t for t in val) and sum("program" not in t for t in val)  # both kinds of problem
    assert not held & {t["kind"] for t in train}
    assert [d["id"] for d in demos] == [f"code_agent-{t['task_id']}" for t in train]  # a demo for each, no more
    test_questions = {t["question"] for t in read("code_test.jsonl")}
    assert not test_questions & {t["question"] for t in val}
    assert main(tmp_path / "again")["val"].read_text() == paths["val"].read_text()  # deterministic


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step(one_step) -> None:
    run = one_step(HERE / "code_agent.yaml", "pipeline.stages=[]", "pipeline.overrides.sft=null", "sandbox.pool_size=1",
                   "trainer.save_last_checkpoint=true")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0, {k: v for k, v in metrics.items() if "failed" in k}
    assert "sandbox/calls" in metrics and "sandbox/timeouts" in metrics  # the sandbox's counts, by name
    assert "workflow/code/valid_rate" in metrics  # the workflow's own
    assert all(any(r["loss_mask"]) for r in run.records(1))
