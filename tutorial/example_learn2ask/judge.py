"""A grader-free judge for learn2ask: the fraction of the hidden facts the doctor uncovered.

    judge:
      type: judge.py:ElicitationJudge     # instead of `type: llm`

Cheap and deterministic (no grader model), but it ignores the summary's quality; the LLM
judge of learn2ask.yaml reads the whole consultation. The workflow reports the uncovered
topics in `output.metadata["revealed"]`.
"""

from __future__ import annotations

from ajet.workflow import WorkflowOutput, WorkflowTask


class ElicitationJudge:
    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        facts = set(task.metadata["facts"])
        revealed = set(output.metadata.get("revealed", [])) & facts
        reward = len(revealed) / len(facts) if facts else 1.0
        return reward, revealed == facts
