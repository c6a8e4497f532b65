"""The code-writing math agent: an AgentScope ReActAgent whose one tool runs the Python the
model writes, in ajet's sandbox (bubblewrap: no network, a throwaway work dir, caps on time,
memory, processes and output; docs/sandbox.md). `code_agent.yaml` turns the sandbox on.

Same tasks and judge as `math_agent.py`; the model writes `print(12 * 34)` where the
calculator agent wrote `12 * 34`, and code can also loop, take several steps and use big
integers. Each episode gets its own warm sandbox and reports what its code did
(`sandbox/calls`, `sandbox/timeouts`, `sandbox/oom`, `sandbox/refused`, ..., and
`code/valid_rate`: the share of calls whose program ran without an error).
"""

# No `from __future__ import annotations`: AgentScope builds the tool's JSON schema from the
# live annotation of `run_python` (its pattern included).
from typing import Annotated

from pydantic import Field

from ajet import Workflow, WorkflowOutput, WorkflowTask
from ajet.sandbox import shared_pool

SYSTEM_PROMPT = (
    "You solve math word problems by writing Python. First call `run_python` with a short program "
    "that prints the answer: for \"Tom buys 12 boxes with 34 pens in each box\", the program is "
    "\"print(12 * 34)\". Then answer with the printed result in \\boxed{}, e.g. \\boxed{408}."
)
TOOL_RESULT_CHARS = 400  # what the model reads of a program's output

# Printable ASCII and newlines, up to 300 characters: a forced call decodes under this
# (rollout.tool_call_grammar), so the call is a program, not prose about one.
Code = Annotated[str, Field(pattern=r"^[ -~\n]{1,300}$")]


def run_python_tool(box):  # noqa: ANN001, ANN201 - AgentScope reads the inner function
    """The `run_python` tool, bound to one episode's sandbox session."""
    from agentscope.message import TextBlock
    from agentscope.tool import ToolResponse

    async def run_python(code: Code):  # noqa: ANN202
        """Run a Python program and return what it prints.

        Args:
            code (str): The program; it must print the answer.
        """
        result = await box.arun_python(str(code))
        return ToolResponse(content=[TextBlock(type="text", text=result.as_tool_text(TOOL_RESULT_CHARS))])

    return run_python


class CodeAgent(Workflow):
    name: str = "code_agent"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        from agentscope.agent import ReActAgent
        from agentscope.formatter import OpenAIChatFormatter
        from agentscope.memory import InMemoryMemory
        from agentscope.message import Msg
        from agentscope.tool import Toolkit

        async with shared_pool().session() as box:
            toolkit = Toolkit()
            toolkit.register_tool_function(run_python_tool(box))
            agent = ReActAgent(
                name="code_agent",
                sys_prompt=SYSTEM_PROMPT,
                model=tuner,
                formatter=OpenAIChatFormatter(),
                toolkit=toolkit,
                memory=InMemoryMemory(),
                max_iters=3,
            )
            agent.set_console_output_enabled(False)
            reply = await agent.reply(Msg("user", task.main_query, role="user"))
            metrics = box.metrics()
            metrics["code/valid_rate"] = box.counts["ok"] / box.calls if box.calls else 0.0
        # reward=None: the configured judge (judge.type: math) compares with task.metadata["answer"].
        return WorkflowOutput(reward=None, metadata={"final_answer": reply.get_text_content() or ""},
                              log_metrics=metrics)
