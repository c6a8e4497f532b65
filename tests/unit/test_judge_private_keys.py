"""Which task metadata keys each judge compares with: what `ajet serve` keeps from clients."""

from __future__ import annotations

import pytest

from ajet.config.schema import JudgeConfig, ServeConfig
from ajet.judge.build import build_judge
from ajet.judge.private_keys import private_metadata_keys


@pytest.mark.parametrize(("kind", "params", "keys"), [
    ("none", {}, set()),  # the client gives the reward: it may need the answer to compute it
    ("math", {}, {"answer"}),
    ("exact_match", {}, {"answer"}),
    ("llm", {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, {"answer"}),
    ("countdown", {}, set()),  # numbers and target are the puzzle itself, not a reference
    ("composite", {"components": {
        "answer": {"type": "task_completion", "judge": {"type": "math"}},
        "tools": {"type": "tool_selection_f1"},
        "steps": {"type": "step_efficiency"},
        "format": {"type": "format_compliance", "pattern": "<answer>"},
    }}, {"answer", "target_tools", "optimal_steps"}),
    ("composite", {"components": {"fmt": {"type": "format_compliance", "pattern": "x"}}}, set()),
])
def test_builtin_judges_name_their_reference_keys(kind: str, params: dict, keys: set[str]) -> None:
    assert private_metadata_keys(build_judge(JudgeConfig(type=kind, params=params))) == frozenset(keys)


def test_a_custom_judge_hides_answer_unless_it_declares_its_keys() -> None:
    class Plain:
        def compute_reward(self, task, output):  # noqa: ANN001, ANN202
            return 0.0, False

    class Declares(Plain):
        private_metadata_keys = ("solution", "tests")

    assert private_metadata_keys(Plain()) == frozenset({"answer"})
    assert private_metadata_keys(Declares()) == frozenset({"solution", "tests"})


def test_serve_config_shows_clients_no_metadata_by_default() -> None:
    assert ServeConfig().public_metadata_keys == []
