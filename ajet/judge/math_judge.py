"""`math`: is the final number right? Reward 1.0 or 0.0; success = reward == 1.

The prediction is the last `\\boxed{...}` in the answer text, else the whole text when it is a
number, else the last number in it. Numbers may carry thousands commas, a currency sign,
`%`, a fraction (`3/4`, `\\frac{3}{4}`), trailing units or a full stop. Two whole numbers
match when equal (exactly, at any size); others when
`math.isclose(pred, truth, rel_tol=tol, abs_tol=tol)`; a percent also matches its /100
value ("50%" = 0.5). When either side is not a number, normalised strings are compared.
Ground truth: `task.metadata["answer"]` (GSM8K's "... #### 72" form is understood).
"""

from __future__ import annotations

import math
import re

from ajet.judge.base import answer_text, ground_truths
from ajet.workflow import WorkflowOutput, WorkflowTask

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+"
_NUMBER_IN_TEXT = re.compile(rf"(?:(?<![\w.])-)?(?:{_NUM})(?:\s*/\s*(?:{_NUM}))?\s*%?")
_LEADING_NUMBER = re.compile(
    rf"^(?P<num>[-+]?(?:{_NUM}))(?:\s*/\s*(?P<den>[-+]?(?:{_NUM})))?\s*(?P<pct>%|percent\b)?"
)


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin : i - 1] if depth == 0 else None


def last_number(text: str) -> str | None:
    matches = _NUMBER_IN_TEXT.findall(text)
    return matches[-1].strip() if matches else None


def _clean(text: str) -> str:
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", text)
    text = re.sub(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}", r" \1", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\$", "$", "€", "£", "\\%"):
        text = text.replace(token, "%" if token == "\\%" else "")
    return text.strip()


def parse_number(text: str) -> tuple[float | int, bool] | None:
    """(value, is_percent) when `text` is one number (units/words may follow), else None. A
    whole number (no point, exponent or fraction) is an exact `int`: a float holds 15-16
    digits, and the code agent's answers run to 20 and more."""
    text = _clean(text).replace("(", "").replace(")", "").strip().rstrip(".").strip()
    match = _LEADING_NUMBER.match(text)
    if match is None:
        return None
    rest = text[match.end() :]
    if re.search(r"[\d=^*+/]", rest):  # an expression or a second number: not one number
        return None
    digits = match.group("num").replace(",", "")
    whole = (re.fullmatch(r"[-+]?\d{1,4000}", digits)  # int() refuses over 4,300 digits
             and match.group("den") is None and match.group("pct") is None)
    value: float | int = int(digits) if whole else float(digits)  # float: inf past its range, as before
    if match.group("den") is not None:
        den = float(match.group("den").replace(",", ""))
        if den == 0:
            return None
        value /= den
    return value, match.group("pct") is not None


def normalise_text(text: str) -> str:
    return re.sub(r"\s+", "", _clean(text)).rstrip(".").lower()


def _values(number: tuple[float | int, bool]) -> list[float | int]:
    value, pct = number
    return [value, value / 100] if pct else [value]


def answers_match(prediction: str, truth: object, tol: float = 1e-6) -> bool:
    """Does the model's answer text match one ground-truth value?"""
    truth_text = str(truth)
    if "####" in truth_text:
        truth_text = truth_text.rsplit("####", 1)[1]
    truth_text = extract_boxed(truth_text) or truth_text
    boxed = extract_boxed(prediction)
    truth_num = parse_number(truth_text)
    if truth_num is None:  # a symbolic answer: compare the boxed part or the whole text
        pred_text = boxed if boxed is not None else prediction
        return bool(pred_text.strip()) and normalise_text(pred_text) == normalise_text(truth_text)
    if boxed is not None:
        pred_text = boxed
    elif parse_number(prediction) is not None:
        pred_text = prediction
    else:
        pred_text = last_number(prediction) or ""
    pred_num = parse_number(pred_text)
    if pred_num is None:
        return False
    return any(_close(p, t, tol) for p in _values(pred_num) for t in _values(truth_num))


def _close(pred: float | int, truth: float | int, tol: float) -> bool:
    """Two whole numbers are equal or not (a relative `tol` would let 7435545 pass for 7435541,
    and a float cannot tell 20-digit numbers apart); anything else is within `tol`."""
    if isinstance(pred, int) and isinstance(truth, int):
        return pred == truth
    return math.isclose(pred, truth, rel_tol=tol, abs_tol=tol)


class MathJudge:
    """Numeric answer check; `tol` is both the relative and the absolute tolerance."""

    def __init__(self, tol: float = 1e-6) -> None:
        if tol < 0:
            raise ValueError(f"judge.params.tol must be >= 0, got {tol}")
        self.tol = tol

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        prediction = answer_text(output)
        ok = any(answers_match(prediction, truth, self.tol) for truth in ground_truths(task))
        return (1.0 if ok else 0.0), ok
