"""An AgentScope ReAct agent with a calculator tool, trained by ajet (simple mode: model=tuner)."""

# No `from __future__ import annotations`: AgentScope builds the tool's JSON schema from the
# live annotation of `calculate` (its pattern included).
from typing import Annotated

from calculator_tool import EXPRESSION_PATTERN, SYSTEM_PROMPT, arithmetic
from pydantic import Field

from ajet import Workflow, WorkflowOutput, WorkflowTask

# The tool's JSON schema says what an expression is; a forced call is decoded under it
# (rollout.tool_call_grammar), so the model cannot write prose there.
Expression = Annotated[str, Field(pattern=EXPRESSION_PATTERN)]


# AgentScope builds the tool's spec from this signature and docstring: it is calculator_tool's
# CALCULATE_TOOL_WITH_PATTERN (test_math_agent.py checks it).
async def calculate(expression: Expression):  # noqa: ANN201 - AgentScope reads the docstring
    """Evaluate an arithmetic expression such as "12 * (3 + 4)".

    Args:
        expression (str): The arithmetic expression to evaluate.
    """
    from agentscope.message import TextBlock
    from agentscope.tool import ToolResponse

    return ToolResponse(content=[TextBlock(type="text", text=arithmetic(str(expression)))])


class MathAgent(Workflow):
    name: str = "math_agent"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        from agentscope.agent import ReActAgent
        from agentscope.formatter import OpenAIChatFormatter
        from agentscope.memory import InMemoryMemory
        from agentscope.message import Msg
        from agentscope.tool import Toolkit

        toolkit = Toolkit()
        toolkit.register_tool_function(calculate)
        agent = ReActAgent(
            name="math_agent",
            sys_prompt=SYSTEM_PROMPT,
            model=tuner,  # the only change to a normal AgentScope agent
            formatter=OpenAIChatFormatter(),
            toolkit=toolkit,
            memory=InMemoryMemory(),
            max_iters=3,
        )
        agent.set_console_output_enabled(False)
        reply = await agent.reply(Msg("user", task.main_query, role="user"))
        answer = reply.get_text_content() or ""
        # reward=None: the configured judge (judge.type: math) compares with task.metadata["answer"].
        return WorkflowOutput(reward=None, metadata={"final_answer": answer})
