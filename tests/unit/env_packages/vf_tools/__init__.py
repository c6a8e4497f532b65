"""verifiers 0.4, tools: the sums of vf_single with a calculator (`add`, `fail`); a reward that
raises when the reply is "break the scorer"."""

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str = ""


class Calculator(vf.Toolset):
    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @vf.tool
    def fail(self) -> str:
        """A tool that always raises."""
        raise RuntimeError("the calculator is broken")


class ToolSumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def right(self, task: SumData, trace: vf.Trace) -> float:
        if trace.last_reply == "break the scorer":
            raise ValueError("the scorer broke")
        return float(task.answer in trace.last_reply)

    @vf.metric
    async def used_tools(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))

    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]


class ToolSumConfig(vf.TasksetConfig):
    count: int = 20


class ToolSumTaskset(vf.Taskset[ToolSumTask, ToolSumConfig]):
    def load(self):
        for i in range(self.config.count):
            yield ToolSumTask(SumData(prompt=f"Use the calculator: what is {i} + {i + 1}?", answer=str(2 * i + 1)))


__all__ = ["ToolSumTaskset"]
