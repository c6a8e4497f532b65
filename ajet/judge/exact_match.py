"""`exact_match`: the answer equals the ground truth after normalisation. Reward 1.0 or 0.0.

Options (judge.params): `ignore_case` (default true), `collapse_whitespace` (true: runs of
whitespace become one space, ends stripped), `ignore_punctuation` (false: when true,
punctuation is removed before comparing). Ground truth: `task.metadata["answer"]` (a value or
a list of accepted values).
"""

from __future__ import annotations

import string

from ajet.judge.base import answer_text, ground_truths
from ajet.workflow import WorkflowOutput, WorkflowTask

_PUNCT = str.maketrans("", "", string.punctuation)


class ExactMatchJudge:
    def __init__(
        self,
        ignore_case: bool = True,
        collapse_whitespace: bool = True,
        ignore_punctuation: bool = False,
    ) -> None:
        self.ignore_case = ignore_case
        self.collapse_whitespace = collapse_whitespace
        self.ignore_punctuation = ignore_punctuation

    def normalise(self, text: str) -> str:
        if self.ignore_punctuation:
            text = text.translate(_PUNCT)
        if self.ignore_case:
            text = text.casefold()
        if self.collapse_whitespace:
            text = " ".join(text.split())
        return text

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        prediction = self.normalise(answer_text(output))
        ok = any(prediction == self.normalise(str(truth)) for truth in ground_truths(task))
        return (1.0 if ok else 0.0), ok
