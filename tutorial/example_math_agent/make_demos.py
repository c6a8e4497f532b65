"""Regenerate demos.jsonl: demonstrations for the SFT warm-up, from the TRAIN split only
(`make_data.py` runs this too; the code agent's from code_train.jsonl, whose problems where code
helps carry their own `program`).

    python tutorial/example_math_agent/make_demos.py                # demos.jsonl (calculator)
    python tutorial/example_math_agent/make_demos.py --agent code   # code_demos.jsonl (code agent)

A scripted agent plays the model behind the unchanged `MathAgent` workflow: the real
AgentScope `ReActAgent` runs with a scripted chat model in place of the tuner. On its first
turn the script calls `calculate` with the task's `expression`; once it sees the tool's
result it answers `\\boxed{<result>}`. The dialog the agent sent on its last turn (system
prompt, tool specs, tool call and tool result exactly as AgentScope formats them), plus the
scripted answer, is one SFT dialog in ajet's format (docs/pipeline.md). So the warm-up
teaches the exact messages the agent produces during RL, and the answer is copied from the
tool, never computed by the model. Val tasks are never read. Deterministic.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def scripted_model(argument: str, tool: str = "calculate") -> Any:
    """An AgentScope chat model that calls `calculate(argument)` (or, for the code agent,
    `run_python(argument)`: a program), then answers the result."""
    from agentscope.message import TextBlock, ToolUseBlock
    from agentscope.model import ChatModelBase, ChatResponse

    class ScriptedModel(ChatModelBase):
        def __init__(self) -> None:
            super().__init__(model_name="scripted", stream=False)
            self.calls: list[dict[str, Any]] = []  # the (messages, tools) of every call

        async def __call__(self, messages: list[dict], tools: list[dict] | None = None,
                           tool_choice: str | None = None, **kwargs: Any) -> ChatResponse:
            self.calls.append({"messages": messages, "tools": tools})
            results = [m for m in messages if m.get("role") == "tool"]
            if not results:
                args = {"expression": argument} if tool == "calculate" else {"code": argument}
                call = ToolUseBlock(type="tool_use", id=f"call_{len(self.calls)}", name=tool, input=args)
                return ChatResponse(content=[call])
            return ChatResponse(content=[TextBlock(type="text", text=f"\\boxed{{{_text(results[-1])}}}")])

    return ScriptedModel()


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # AgentScope may send content blocks
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return str(content)


# agent -> (its workflow, its tool, its train split, the demos file): the calculator agent and the code agent
AGENTS = {"calculator": ("math_agent:MathAgent", "calculate", "train.jsonl", "demos.jsonl"),
          "code": ("code_agent:CodeAgent", "run_python", "code_train.jsonl", "code_demos.jsonl")}


def program(task: dict) -> str:
    """The code agent's program for a task: its own (a problem where code helps) or the
    expression printed."""
    return task.get("program") or f"print({task['expression']})"


async def demo(task: dict, agent: str = "calculator") -> dict:
    """One SFT dialog: the scripted agent solving `task` through the real workflow (the code
    agent's program runs in the sandbox, as in training)."""
    import importlib

    from ajet import WorkflowTask

    target, tool, _, _ = AGENTS[agent]
    module, cls = target.split(":")
    workflow = getattr(importlib.import_module(module), cls)()
    model = scripted_model(task["expression"] if tool == "calculate" else program(task), tool)
    wt = WorkflowTask(task_id=task["task_id"], main_query=task["question"], metadata=task)
    output = await workflow.execute(wt, model)
    last = model.calls[-1]
    answer = output.metadata["final_answer"]
    if answer != f"\\boxed{{{task['answer']}}}":
        raise ValueError(f"{task['task_id']}: the scripted agent answered {answer!r}, expected {task['answer']}")
    return {
        "id": f"{'math_agent' if agent == 'calculator' else 'code_agent'}-{task['task_id']}",
        "task_type": "math_tool",
        "target_tools": [tool],
        "tools": last["tools"],
        "messages": [*last["messages"], {"role": "assistant", "content": answer}],
    }


def main(out_dir: Path = HERE, count: int | None = None, agent: str = "calculator") -> Path:
    import sys

    if str(HERE) not in sys.path:  # math_agent.py, when run as a script from elsewhere
        sys.path.insert(0, str(HERE))
    _, _, split, demos = AGENTS[agent]
    tasks = [json.loads(line) for line in (out_dir / split).read_text().splitlines()][:count]
    dialogs = asyncio.run(_all(tasks, agent))
    path = out_dir / demos
    path.write_text("".join(json.dumps(d) + "\n" for d in dialogs))
    return path


async def _all(tasks: list[dict], agent: str) -> list[dict]:
    return [await demo(task, agent) for task in tasks]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", choices=sorted(AGENTS), default="calculator",
                        help="calculator: demos.jsonl; code: code_demos.jsonl (needs the sandbox: make sandbox)")
    main(agent=parser.parse_args().agent)
