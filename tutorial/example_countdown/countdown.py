"""Countdown: reach the target with the given numbers and + - * /, in one model call.

The tuner is used as a plain AgentScope chat model (`await tuner(messages)`), no agent
around it. The workflow returns reward=None; the `countdown` judge scores the expression
inside <answer>...</answer>: 1 when it reaches the target using the given numbers,
`format_score` for a well-formed expression that misses, 0 for no expression.
"""

from __future__ import annotations

from ajet import Workflow, WorkflowOutput, WorkflowTask

SYSTEM_PROMPT = (
    "You solve number puzzles. Combine the given numbers with + - * / and parentheses to reach "
    "the target; use each number at most once. Think briefly, then write only the expression "
    "inside <answer></answer>, e.g. <answer>(25 - 4) * 3</answer>."
)


def user_prompt(numbers: list[int], target: int) -> str:
    return f"Numbers: {numbers}. Target: {target}."


class CountdownAgent(Workflow):
    name: str = "countdown"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        numbers, target = task.metadata["numbers"], task.metadata["target"]
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_prompt(numbers, target)},
        ]
        response = await tuner(messages)  # an AgentScope ChatResponse
        text = "".join(block["text"] for block in response.content if block["type"] == "text")
        has_tag = "<answer>" in text and "</answer>" in text
        return WorkflowOutput(
            reward=None, metadata={"final_answer": text}, log_metrics={"answer_tag": float(has_tag)}
        )
