"""scripts/bench/vs_trl.py: trl_helped's shaping reward, and the goal judged against each TRL
variant that ran (without TRL installed: the bench imports TRL only in its child process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def bench(script: Any) -> Any:
    return script("bench.vs_trl")


def test_shaping_pays_a_call_that_ran_more_than_markup_trl_could_not_parse(bench: Any) -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}
    ran = [call, {"role": "tool", "name": "calculate", "content": "42"}, {"role": "assistant", "content": "42"}]
    failed = [call, {"role": "tool", "name": "calculate", "content": f"{bench.TOOL_ERROR} invalid syntax"}]
    trl_failed = [call, {"role": "tool", "name": "calc", "content": "{'error': 'Tool calc not found.'}"}]
    markup = [{"role": "assistant", "content": '<tool_call>\n{"name": calculate}'}]
    plain = [{"role": "assistant", "content": "The answer is \\boxed{42}."}]
    assert bench.tool_shaping_reward([ran, failed, trl_failed, markup, plain]) == [0.2, 0.0, 0.0, 0.1, 0.0]
    # a failed call beside one that ran still ran
    assert bench.tool_shaping_reward([[*failed, *ran]]) == [0.2]


def test_the_goal_is_judged_against_each_trl_variant(bench: Any) -> None:
    curves = {"ajet": {0.0: 0.0, 5.0: 0.062, 10.0: 0.219, 15.0: 0.25},
              "trl": {0.0: 0.0, 5.0: 0.0, 15.0: 0.0},
              "trl_helped": {0.0: 0.0, 5.0: 0.031, 15.0: 0.125}}
    text = bench.goal_text(curves, 15.0)
    assert "met: ajet reached trl's 0.000 (at 15 min) by 5 min" in text
    assert "missed: ajet reached trl_helped's 0.125 (at 15 min) by 10 min" in text
    curves["trl_helped"][15.0] = 0.5
    assert "missed: ajet never reached trl_helped's 0.500" in bench.goal_text(curves, 15.0)
    curves["trl_helped"][15.0] = None
    assert "not judged against trl_helped" in bench.goal_text(curves, 15.0)
    assert bench.goal_text({"ajet": curves["ajet"]}, 15.0) == "not judged: no TRL method ran"


def test_each_seed_is_evaluated_afresh_in_a_shared_experiment_dir(bench: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A second seed's run in the same --exp-dir must not read the first seed's reports."""
    evaluated = []

    def fake_run(cmd: list[str]) -> None:  # `ajet eval` writes RUN/eval/eval_NAME.json
        name = cmd[cmd.index("--name") + 1]
        evaluated.append(name)
        report = tmp_path / "eval" / "eval" / f"eval_{name}.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(f'{{"metrics": {{"success/rate": {len(evaluated) / 10}}}}}')

    monkeypatch.setattr(bench, "run", fake_run)
    model = tmp_path / "model"
    model.mkdir()
    seed0 = bench.parse_args(["--exp-dir", str(tmp_path), "--seed", "0"])
    seed1 = bench.parse_args(["--exp-dir", str(tmp_path), "--seed", "1"])
    assert bench.evaluate(seed0, "ajet", 5.0, model) == 0.1
    assert bench.evaluate(seed1, "ajet", 5.0, model) == 0.2
    assert bench.evaluate(seed0, "ajet", 5.0, model) == 0.1  # read back, not evaluated again
    assert evaluated == ["ajet_seed0_min_5", "ajet_seed1_min_5"]
    assert bench.evaluate(seed0, "ajet", 10.0, tmp_path / "never_written") is None
