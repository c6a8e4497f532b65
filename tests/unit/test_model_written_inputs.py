"""What the model writes never turns an episode into a failure it is not penalised for (issue 53):
every tool and judge the tutorials ship, and the tool-call parser, take any text and answer with a
result (an "error: ..." the model reads, a reward of 0), never an exception. Property-based
(hypothesis), plus the inputs that raised before: "1" + "0"*400 (OverflowError), ~1000 nested
"-" (RecursionError), 100k nested parentheses (MemoryError), and <answer>1e999</answer> in the
countdown judge (Fraction('inf'))."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ajet.engine.chat import parse_completion
from ajet.judge.countdown import CountdownJudge
from ajet.judge.exact_match import ExactMatchJudge
from ajet.judge.math_judge import MathJudge
from ajet.workflow import WorkflowOutput, WorkflowTask

TUTORIAL = Path(__file__).parents[2] / "tutorial"
NASTY = ["1" + "0" * 400, "1" + "0" * 400 + "/3", "-" * 1000 + "1", "-" * 190 + "1", "(" * 100_000 + "1",
         "(" * 90 + "1" + ")" * 90, "1e999", "1e999*0", "9" * 199, "2**99999", "\x00", "1/0", "", " ", "()"]
# Text the model might write: printable and not, digits and operators weighted in.
TEXT = st.one_of(st.text(max_size=300), st.text(alphabet="0123456789+-*/(). e", max_size=300),
                 st.sampled_from(NASTY))
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def calculator() -> Any:
    """The tutorials' one calculator (tutorial/example_math_agent/calculator_tool.py): the
    AgentScope, OpenAI-SDK and raw-HTTP math agents and the remote agent all run it."""
    spec = importlib.util.spec_from_file_location("calculator_tool_under_test",
                                                  TUTORIAL / "example_math_agent" / "calculator_tool.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("expression", NASTY)
def test_the_inputs_that_raised_before_are_results(calculator: Any, expression: str) -> None:
    for result in (calculator.arithmetic(expression),
                   calculator.run_tool_call({"function": {"name": "calculate",
                                                          "arguments": json.dumps({"expression": expression})}})):
        assert isinstance(result, str) and result
    assert calculator.arithmetic("1" + "0" * 400).startswith("error:")  # was an uncaught OverflowError
    assert calculator.arithmetic("-" * 1000 + "1").startswith("error:")
    assert calculator.arithmetic("12 * (3 + 4)") == "84"


@SETTINGS
@given(expression=TEXT)
def test_every_calculator_answers_any_expression(calculator: Any, expression: str) -> None:
    assert isinstance(calculator.arithmetic(expression), str)


JSON = st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=50),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
                    max_leaves=20)


@SETTINGS
@given(name=st.one_of(st.just("calculate"), st.text(max_size=20)),
       arguments=st.one_of(TEXT, JSON.map(json.dumps), st.fixed_dictionaries({"expression": JSON}).map(json.dumps)))
def test_the_tool_call_runner_answers_any_arguments(calculator: Any, name: str, arguments: str) -> None:
    assert isinstance(calculator.run_tool_call({"function": {"name": name, "arguments": arguments}}), str)


JUDGES = [
    (MathJudge(), {"answer": "42"}),
    (ExactMatchJudge(), {"answer": "42"}),
    (CountdownJudge(), {"numbers": [3, 7, 25, 50], "target": 75}),
]


@pytest.mark.parametrize("judge, metadata", JUDGES, ids=lambda j: type(j).__name__ if not isinstance(j, dict) else "")
@SETTINGS
@given(answer=TEXT)
def test_every_judge_scores_any_answer(judge: Any, metadata: dict, answer: str) -> None:
    task = WorkflowTask(task_id="t", main_query="q", metadata=metadata)
    for final in (answer, f"<answer>{answer}</answer>", f"\\boxed{{{answer}}}"):
        reward, success = judge.compute_reward(task, WorkflowOutput(reward=None, metadata={"final_answer": final}))
        assert 0.0 <= reward <= 1.0 and isinstance(success, bool)


def test_the_countdown_judge_scores_an_infinite_number_zero() -> None:
    task = WorkflowTask(task_id="t", main_query="q", metadata={"numbers": [3, 7, 25, 50], "target": 75})
    for answer in ("<answer>1e999</answer>", "<answer>1e999 - 1e999</answer>", "<answer>" + "(" * 299 + "</answer>"):
        assert CountdownJudge().compute_reward(task, WorkflowOutput(reward=None, metadata={"final_answer": answer})) == (
            0.0, False)


@SETTINGS
@given(text=st.one_of(st.text(max_size=400), TEXT.map(lambda s: f'<tool_call>\n{{"name": "add", "arguments": {s}}}\n</tool_call>'),
                      JSON.map(lambda j: f"<tool_call>\n{json.dumps(j)}\n</tool_call>"),
                      st.text(max_size=100).map(lambda s: f"<tool_call>{s}")))
def test_the_tool_call_parser_takes_any_reply(text: str) -> None:
    parsed = parse_completion(text)
    assert isinstance(parsed.content, str) and isinstance(parsed.tool_calls, list)
