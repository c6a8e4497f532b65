"""The math agent written with the OpenAI SDK: a hand-written tool loop on `tuner.openai_client()`.

Any code that speaks the chat-completions protocol trains the same way: the client points
at ajet's gateway, whose API key routes every call into this episode's records.
"""

from __future__ import annotations

from typing import Any

from calculator_tool import CALCULATE_TOOL, SYSTEM_PROMPT, run_tool_call

from ajet import Workflow, WorkflowOutput, WorkflowTask

MAX_ITERS = 3  # model turns, as ReActAgent(max_iters=3) in math_agent.py


class OpenAIMathAgent(Workflow):
    name: str = "math_agent_openai"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        client = tuner.openai_client()  # an openai.AsyncOpenAI bound to this episode
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.main_query},
        ]
        answer, tool_calls = "", 0
        for _ in range(MAX_ITERS):
            response = await client.chat.completions.create(
                model="policy", messages=messages, tools=[CALCULATE_TOOL]
            )
            message = response.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)  # the reply goes back unchanged: the next call extends this one
            answer = message.get("content") or answer
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                tool_calls += 1
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool_call(call)})
        # reward=None: the configured judge (judge.type: math) compares with task.metadata["answer"].
        return WorkflowOutput(
            reward=None, metadata={"final_answer": answer}, log_metrics={"tool_calls": tool_calls}
        )
