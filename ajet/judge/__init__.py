"""Judges: (task, output) -> (reward, is_success). `build_judge(cfg.judge)` is the entry point.

Keys the built-in judges read (see `ajet.judge.base`):
- answer: `output.metadata["final_answer"]`, else `["answer"]`, else `["text"]`;
- ground truth: `task.metadata["answer"]` (math, exact_match, llm as reference);
- countdown: `task.metadata["numbers"]`, `task.metadata["target"]`;
- composite: `output.metadata["tools_used" | "steps" | "task_completed" | "format_ok" |
  <penalty names>]`, `task.metadata["target_tools" | "optimal_steps"]`.
"""

from ajet.judge.base import Judge, JudgeError, answer_text, ascore, ground_truths
from ajet.judge.build import BUILTINS, build_judge, load_target

__all__ = [
    "BUILTINS",
    "Judge",
    "JudgeError",
    "answer_text",
    "ascore",
    "build_judge",
    "ground_truths",
    "load_target",
]
