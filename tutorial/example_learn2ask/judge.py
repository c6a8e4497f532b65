"""Grader-free judges for learn2ask, two different rubrics:

- `ElicitationJudge`: the fraction of the hidden facts the doctor uncovered by its questions;
- `SummaryJudge`: the fraction of the hidden facts the doctor's final summary states
  (`summary_recall`: most of a fact's content words appear in the summary).

    judge:
      type: judge.py:ElicitationJudge     # instead of `type: llm`

Both are cheap and deterministic (no grader model). The elicitation rubric ignores the summary;
the summary rubric asks for the questions' fruit *and* a summary that keeps it, so a doctor that
asks well but summarises badly scores lower on it. The workflow logs both (`workflow/
facts_elicited`, `workflow/summary_recall`) under any judge: a run trained on one shows whether
the other agrees. The workflow reports the uncovered topics in `output.metadata["revealed"]` and
the summary in `output.metadata["summary"]`.
"""

from __future__ import annotations

import math
import re

from ajet.workflow import WorkflowOutput, WorkflowTask

# Words that carry no fact: a fact's content words are its other words (negations and numbers stay).
STOPWORDS = frozenset(
    "i a an the it is of to and have had has am take about maybe out this that every thing same been "
    "going on for be my me".split()
)


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+|\d+(?:\.\d+)?", text.lower()) if w not in STOPWORDS}


def fact_stated(fact: str, summary: str) -> bool:
    """Whether `summary` states `fact`: at least two thirds of its content words appear in it."""
    words = content_words(fact)
    return bool(words) and len(words & content_words(summary)) >= math.ceil(2 * len(words) / 3)


def summary_recall(summary: str, facts: dict[str, str]) -> float:
    """The fraction of `facts` (topic -> the patient's sentence) that `summary` states."""
    return sum(fact_stated(f, summary) for f in facts.values()) / len(facts) if facts else 1.0


class ElicitationJudge:
    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        facts = set(task.metadata["facts"])
        revealed = set(output.metadata.get("revealed", [])) & facts
        reward = len(revealed) / len(facts) if facts else 1.0
        return reward, revealed == facts


class SummaryJudge:
    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        reward = summary_recall(str(output.metadata.get("summary", "")), task.metadata["facts"])
        return reward, reward == 1.0
