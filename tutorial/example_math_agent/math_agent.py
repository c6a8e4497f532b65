"""An AgentScope ReAct agent with a calculator tool, trained by ajet (simple mode: model=tuner)."""

# No `from __future__ import annotations`: AgentScope builds the tool's JSON schema from the
# live annotation of `calculate` (its pattern included).
import ast
import operator
from typing import Annotated

from pydantic import Field

from ajet import Workflow, WorkflowOutput, WorkflowTask

SYSTEM_PROMPT = (
    "You solve arithmetic word problems with the `calculate` tool. First call `calculate` with "
    "the expression made of the problem's numbers: for \"Tom buys 12 boxes with 34 pens in each "
    "box\", the expression is \"12 * 34\". Then answer with the tool's result in \\boxed{}, "
    "e.g. \\boxed{408}."
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


MAX_EXPRESSION_CHARS = 200
# What a model-written expression can raise beyond a syntax error: a result too large for a
# float (OverflowError), nesting too deep for the parser or the evaluation (RecursionError,
# MemoryError). Each is a result the model reads, never a crashed episode.
CALCULATOR_ERRORS = (SyntaxError, ValueError, ZeroDivisionError, TypeError, OverflowError, RecursionError,
                     MemoryError)


def arithmetic(expression: str) -> str:
    """The calculator: the value of `expression` (numbers, + - * / and parentheses; no `eval`),
    or "error: ..." for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: the expression is longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        return f"{_evaluate(ast.parse(expression, mode='eval').body):g}"
    except CALCULATOR_ERRORS as exc:
        return f"error: {type(exc).__name__}: {exc}" if str(exc) else f"error: {type(exc).__name__}"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("only numbers and + - * / are allowed")


# The tool's JSON schema says what an expression is; a forced call is decoded under it
# (rollout.tool_call_grammar), so the model cannot write prose there.
Expression = Annotated[str, Field(pattern=r"^[0-9+\-*/(). ]{1,60}$")]


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
