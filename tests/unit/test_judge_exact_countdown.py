"""`exact_match` and `countdown` judges."""

from __future__ import annotations

import pytest

from ajet.judge import JudgeError
from ajet.judge.countdown import CountdownJudge, MalformedExpression, evaluate, parse_expression
from ajet.judge.exact_match import ExactMatchJudge
from ajet.workflow import WorkflowOutput, WorkflowTask


def out(text: str) -> WorkflowOutput:
    return WorkflowOutput(metadata={"final_answer": text})


def em(prediction: str, truth: object, **kw) -> float:
    task = WorkflowTask(task_id="t", metadata={"answer": truth})
    return ExactMatchJudge(**kw).compute_reward(task, out(prediction))[0]


def test_exact_match_defaults() -> None:
    assert em("  Paris \n", "paris") == 1.0
    assert em("New   York", "new york") == 1.0
    assert em("Paris.", "Paris") == 0.0  # punctuation matters by default
    assert em("Lyon", ["Paris", "Lyon"]) == 1.0
    assert em("Lyon", "Paris") == 0.0


def test_exact_match_options() -> None:
    assert em("Paris.", "paris", ignore_punctuation=True) == 1.0
    assert em("paris", "Paris", ignore_case=False) == 0.0
    assert em("new  york", "new york", collapse_whitespace=False) == 0.0


def cd(answer: str, numbers=(3, 5, 7), target=22, **kw) -> tuple[float, bool]:
    task = WorkflowTask(task_id="c", metadata={"numbers": list(numbers), "target": target})
    return CountdownJudge(**kw).compute_reward(task, out(answer))


@pytest.mark.parametrize("answer", [
    "3*5+7",
    "(5 * 3) + 7",
    "<think>try 3*5 = 15, +7</think> <answer>3 * 5 + 7</answer>",
    "7 + 5 × 3 = 22",
    "7 + 5*3.",
])
def test_countdown_correct(answer: str) -> None:
    assert cd(answer) == (1.0, True)


def test_countdown_wrong_but_well_formed_gets_format_score() -> None:
    assert cd("3+5+7") == (0.1, False)  # value 15
    assert cd("3*5+7+7") == (0.1, False)  # 7 used twice
    assert cd("3*6+4") == (0.1, False)  # numbers not given
    assert cd("7/(5-5)") == (0.1, False)  # division by zero (and 5 used twice)
    assert cd("3+5+7", format_score=0.25) == (0.25, False)


def test_countdown_malformed_scores_zero() -> None:
    for answer in ["", "three times five", "__import__('os').system('x')", "2**10", "3*5+7; 1",
                   "[3, 5]", "abs(-22)", "3 // 5", "True + 21"]:
        assert cd(answer) == (0.0, False), answer


def test_countdown_exact_arithmetic_and_division() -> None:
    assert cd("(7-5)/3*33", numbers=(7, 5, 3, 33), target=22) == (1.0, True)
    assert cd("1/3*3", numbers=(1, 3, 3), target=1) == (1.0, True)  # exact, no float rounding


def test_countdown_use_all_numbers_param() -> None:
    assert cd("3*5+7", numbers=(3, 5, 7, 1)) == (1.0, True)  # at most once (default)
    assert cd("3*5+7", numbers=(3, 5, 7, 1), use_all_numbers=True) == (0.1, False)
    assert cd("3*5+7*1", numbers=(3, 5, 7, 1), use_all_numbers=True) == (1.0, True)


def test_countdown_needs_numbers_and_target() -> None:
    task = WorkflowTask(task_id="c", metadata={"numbers": [1]})
    with pytest.raises(JudgeError, match="needs metadata 'numbers'.*and 'target'"):
        CountdownJudge().compute_reward(task, out("1"))


def test_parse_expression_rejects_code() -> None:
    with pytest.raises(MalformedExpression):
        parse_expression("(lambda: 1)()")
    with pytest.raises(MalformedExpression):
        parse_expression("1" * 400)
    tree, numbers = parse_expression("-(2+3)*4")
    assert evaluate(tree) == -20 and sorted(numbers) == [2, 3, 4]
