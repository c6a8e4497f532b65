"""verifiers 0.4, a tool environment: a question about two numbers in words ("the product of 7
and 12"), a calculator with three tools (add, subtract, multiply), and the reward for the right
number in the final answer. Which tool a question needs is in its wording: what a model learns
here is to read it, call the right tool with the question's numbers, and report the result.

The k-th task is made from (seed, k) alone, so a taskset's tasks are the same on every machine.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

SYSTEM_PROMPT = ("You have a calculator with the tools add, subtract and multiply. Call the one the question "
                 "needs with its two numbers, then answer with the result.")

# (the tool, how a question names it); a/b are the numbers in the question's order
WORDINGS = {
    "add": ["What is the sum of {a} and {b}?", "What is {a} plus {b}?", "Add {a} and {b}."],
    "subtract": ["What is {a} minus {b}?", "What is the difference {a} - {b}?", "Subtract {b} from {a}."],
    "multiply": ["What is the product of {a} and {b}?", "What is {a} times {b}?", "Multiply {a} by {b}."],
}
RESULT = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b}


class ArithData(vf.TaskData):
    answer: str = ""
    tool: str = ""


class Calculator(vf.Toolset):
    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers: a + b."""
        return str(a + b)

    @vf.tool
    def subtract(self, a: int, b: int) -> str:
        """Subtract two integers: a - b."""
        return str(a - b)

    @vf.tool
    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers: a * b."""
        return str(a * b)


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def right(self, task: ArithData, trace: vf.Trace) -> float:
        """The answer's number appears (as a whole number) in the final reply."""
        # not part of a longer number: "12" is in "is 12." but not in "112" or "12.5"
        number = rf"(?<![\d.-]){re.escape(task.answer)}(?!\d|\.\d)"
        return float(re.search(number, trace.last_reply or "") is not None)

    @vf.metric
    async def right_tool(self, task: ArithData, trace: vf.Trace) -> float:
        """The first tool called is the one the question needs."""
        calls = [m.name for m in trace.tool_messages]
        return float(bool(calls) and calls[0] == task.tool)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))

    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]


class ArithConfig(vf.TasksetConfig):
    count: int = 1000
    seed: int = 0
    low: int = 2
    high: int = 30


def make_task(seed: int, k: int, low: int, high: int) -> ArithTask:
    rng = random.Random(f"vf-arith-{seed}-{k}")
    tool = rng.choice(sorted(WORDINGS))
    a, b = rng.randint(low, high), rng.randint(low, high)
    prompt = rng.choice(WORDINGS[tool]).format(a=a, b=b)
    return ArithTask(ArithData(prompt=prompt, system_prompt=SYSTEM_PROMPT, answer=str(RESULT[tool](a, b)), tool=tool))


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        for k in range(self.config.count):
            yield make_task(self.config.seed, k, self.config.low, self.config.high)


__all__ = ["ArithTaskset"]
