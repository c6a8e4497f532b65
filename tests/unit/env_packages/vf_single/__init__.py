"""verifiers 0.4, single-turn: "What is a + b?"; rewards: right (0.8), short (0.2); metric: length."""

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=0.8)
    async def right(self, task: SumData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.2)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 4)

    @vf.metric
    async def length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    count: int = 20
    offset: int = 0


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for i in range(self.config.offset, self.config.offset + self.config.count):
            yield SumTask(SumData(prompt=f"What is {i} + {i + 1}?", system_prompt="Answer with the number only.",
                                  answer=str(2 * i + 1)))


__all__ = ["SumTaskset"]
