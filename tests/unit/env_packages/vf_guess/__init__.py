"""verifiers 0.4, multi-turn: guess the number (6) with the `guess` tool, which answers higher,
lower or right, turn after turn; the reward is 1 once a guess was right, minus 0.1 a guess."""

import verifiers.v1 as vf

SECRET = 6


class Oracle(vf.Toolset):
    @vf.tool
    def guess(self, number: int) -> str:
        """Guess the number; the answer is higher, lower or right."""
        return "right" if number == SECRET else ("higher" if number < SECRET else "lower")


class GuessTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(any(m.content == "right" for m in trace.tool_messages))

    @vf.reward(weight=-0.1)
    async def guesses(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))

    @classmethod
    def toolsets(cls, config):
        return [Oracle(vf.ToolsetConfig())]


class GuessConfig(vf.TasksetConfig):
    count: int = 10


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        for i in range(self.config.count):
            yield GuessTask(vf.TaskData(prompt=f"Game {i}: guess my number from 0 to 9."))


__all__ = ["GuessTaskset"]
