"""`build_judge`: none, built-ins with params, custom judges from a module or a file."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from ajet.config.schema import JudgeConfig
from ajet.judge import BUILTINS, Judge, JudgeError, ascore, build_judge
from ajet.workflow import WorkflowOutput, WorkflowTask

CUSTOM = '''
class LengthJudge:
    def __init__(self, target=3, llm_client_factory=None):
        self.target = target
        self.factory = llm_client_factory

    def compute_reward(self, task, output):
        ok = len(output.metadata.get("final_answer", "")) == self.target
        return (1.0 if ok else 0.0), ok


class NotAJudge:
    pass
'''


def test_none_and_builtins() -> None:
    assert build_judge(JudgeConfig(type="none")) is None
    for name in ("math", "exact_match", "countdown"):
        judge = build_judge(JudgeConfig(type=name))
        assert isinstance(judge, Judge)
    assert build_judge(JudgeConfig(type="math", params={"tol": 0.5})).tol == 0.5
    assert set(BUILTINS) == {"math", "exact_match", "countdown", "llm", "composite", "group_rank"}


def test_unknown_param_lists_accepted() -> None:
    with pytest.raises(JudgeError, match=r"unknown \['tolerance'\] for judge 'math'; it accepts \['tol'\]"):
        build_judge(JudgeConfig(type="math", params={"tolerance": 0.1}))


def test_unknown_type() -> None:
    with pytest.raises(JudgeError, match="'rouge' is not one of"):
        build_judge(JudgeConfig(type="rouge"))


def test_custom_judge_from_file(tmp_path: Path) -> None:
    path = tmp_path / "my_judges.py"
    path.write_text(CUSTOM)
    sentinel = object()
    judge = build_judge(JudgeConfig(type=f"{path}:LengthJudge", params={"target": 2}),
                        llm_client_factory=lambda: sentinel)
    task = WorkflowTask(task_id="t")
    assert judge.compute_reward(task, WorkflowOutput(metadata={"final_answer": "ab"})) == (1.0, True)
    assert judge.factory() is sentinel  # passed because __init__ asks for it
    assert asyncio.run(ascore(judge, task, WorkflowOutput(metadata={"final_answer": "abc"}))) == (0.0, False)
    with pytest.raises(JudgeError, match="has no compute_reward"):
        build_judge(JudgeConfig(type=f"{path}:NotAJudge"))
    with pytest.raises(JudgeError, match="has no 'Missing'"):
        build_judge(JudgeConfig(type=f"{path}:Missing"))
    with pytest.raises(JudgeError, match="file not found"):
        build_judge(JudgeConfig(type=f"{tmp_path / 'nope.py'}:X"))


def test_custom_judge_from_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "judge_pkg_for_test.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        judge = build_judge(JudgeConfig(type="judge_pkg_for_test:LengthJudge"))
        assert judge.target == 3
    finally:
        sys.modules.pop("judge_pkg_for_test", None)
    with pytest.raises(JudgeError, match="cannot import 'no_such_module_xyz'"):
        build_judge(JudgeConfig(type="no_such_module_xyz:Judge"))


def test_kwargs_judge_gets_params_but_no_factory(tmp_path: Path) -> None:
    path = tmp_path / "kw.py"
    path.write_text(
        "class KwJudge:\n"
        "    def __init__(self, **kwargs):\n"
        "        self.kwargs = kwargs\n"
        "    def compute_reward(self, task, output):\n"
        "        return 1.0, True\n"
    )
    judge = build_judge(JudgeConfig(type=f"{path}:KwJudge", params={"a": 1}), llm_client_factory=object)
    assert judge.kwargs == {"a": 1}
