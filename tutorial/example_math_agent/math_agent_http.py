"""The math agent over raw HTTP: `httpx` POSTs to the gateway from `tuner.base_url_and_key()`.

What any language or framework can do: send OpenAI chat-completions JSON with
`Authorization: Bearer <key>`. The key belongs to this episode; it dies when the episode ends.
"""

from __future__ import annotations

from typing import Any

import httpx
from calculator_tool import CALCULATE_TOOL, SYSTEM_PROMPT, run_tool_call

from ajet import Workflow, WorkflowOutput, WorkflowTask

MAX_ITERS = 3


class HttpMathAgent(Workflow):
    name: str = "math_agent_http"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        base_url, api_key = tuner.base_url_and_key()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.main_query},
        ]
        answer, tool_calls = "", 0
        headers = {"Authorization": f"Bearer {api_key}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as http:
            for _ in range(MAX_ITERS):
                response = await http.post(
                    "/chat/completions",
                    json={"model": "policy", "messages": messages, "tools": [CALCULATE_TOOL]},
                )
                # A 4xx is this agent's bug (bad request), a 5xx the engine's: raise_for_status
                # fails the episode either way, and the step counts it.
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
                messages.append(message)
                answer = message.get("content") or answer
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    tool_calls += 1
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": run_tool_call(call)}
                    )
        return WorkflowOutput(
            reward=None, metadata={"final_answer": answer}, log_metrics={"tool_calls": tool_calls}
        )
