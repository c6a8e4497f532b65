"""`math` judge: boxed / last-number extraction, numeric tolerance, formats, string fallback."""

from __future__ import annotations

import pytest

from ajet.judge import JudgeError
from ajet.judge.math_judge import MathJudge, answers_match, extract_boxed, last_number, parse_number
from ajet.workflow import WorkflowOutput, WorkflowTask


def judge(prediction: str, truth: object, **kw) -> tuple[float, bool]:
    task = WorkflowTask(task_id="t", main_query="q", metadata={"answer": truth})
    return MathJudge(**kw).compute_reward(task, WorkflowOutput(metadata={"final_answer": prediction}))


@pytest.mark.parametrize("prediction,truth", [
    ("72", "72"),
    ("The answer is 72.", "72"),
    ("First 9*8 = 72 then... so \\boxed{72} and 100 more words 5", "72"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("It is 3/4.", "0.75"),
    ("$1,234.50", "1234.5"),
    ("There are 12 apples.", "12"),
    ("50%", "0.5"),
    ("0.5", "50%"),
    ("50 percent", "50"),
    ("So x = -3", "-3"),
    ("72.0000001", "72"),
    ("Natalia sold 48/2 = 24 clips in May. #### 72 no: 72", "She sold ... #### 72"),
    ("\\boxed{x^2 + 1}", "x^2+1"),
    ("\\boxed{\\text{Paris}}", "paris"),
])
def test_matches(prediction: str, truth: object) -> None:
    assert judge(prediction, truth) == (1.0, True)


@pytest.mark.parametrize("prediction,truth", [
    ("73", "72"),
    ("The answer is 72 or maybe 71", "72"),  # the last number counts
    ("\\boxed{71} although 72", "72"),  # the boxed answer counts
    ("no idea", "72"),
    ("", "72"),
    ("72.01", "72"),
    ("3x+2", "3"),
    ("\\boxed{x^2 - 1}", "x^2+1"),
])
def test_mismatches(prediction: str, truth: object) -> None:
    assert judge(prediction, truth) == (0.0, False)


def test_tolerance_is_a_param() -> None:
    assert judge("72.01", "72", tol=1e-3) == (1.0, True)
    assert judge("72.2", "72", tol=1e-3) == (0.0, False)
    with pytest.raises(ValueError, match="tol"):
        MathJudge(tol=-1)


def test_numeric_and_list_ground_truth() -> None:
    assert judge("72", 72)[0] == 1.0
    assert judge("0.5", ["1/2", "half"])[0] == 1.0
    assert judge("half", ["1/2", "half"])[0] == 1.0


def test_answer_keys_in_order() -> None:
    task = WorkflowTask(task_id="t", metadata={"answer": "5"})
    j = MathJudge()
    assert j.compute_reward(task, WorkflowOutput(metadata={"final_answer": "5", "answer": "6"}))[0] == 1.0
    assert j.compute_reward(task, WorkflowOutput(metadata={"answer": 5}))[0] == 1.0
    assert j.compute_reward(task, WorkflowOutput(metadata={"text": "it is 5"}))[0] == 1.0
    assert j.compute_reward(task, WorkflowOutput(metadata={}))[0] == 0.0


def test_missing_ground_truth_is_an_error() -> None:
    with pytest.raises(JudgeError, match="task 't' has no metadata\\['answer'\\]"):
        MathJudge().compute_reward(WorkflowTask(task_id="t"), WorkflowOutput(metadata={"answer": "1"}))


def test_helpers() -> None:
    assert extract_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{unclosed") is None
    assert last_number("from 5 to -3, then 1,000") == "1,000"
    assert last_number("pages 5-7") == "7"
    assert parse_number("1,000 kg.") == (1000.0, False)
    assert parse_number("12%") == (12.0, True)
    assert parse_number("1/0") is None
    assert parse_number("2 and 3") is None
    assert answers_match("\\dfrac{1}{4}", "0.25")


@pytest.mark.parametrize("prediction,truth,ok", [
    ("\\boxed{123456789012345678901}", "123456789012345678901", True),   # past a float's 2**53
    ("\\boxed{123456789012345678900}", "123456789012345678901", False),  # a float calls these equal
    ("\\boxed{7435545}", "7435541", False),  # inside rel_tol=1e-6, but whole numbers are exact
    ("\\boxed{7,435,541}", "7435541", True),
    ("72.0", "72", True),                    # a decimal keeps the tolerance
    ("1" * 5000, "5", False),                # past int()'s 4,300 digits: a float (inf), no error
])
def test_whole_numbers_are_compared_exactly(prediction: str, truth: str, ok: bool) -> None:
    assert judge(prediction, truth) == ((1.0, True) if ok else (0.0, False))
