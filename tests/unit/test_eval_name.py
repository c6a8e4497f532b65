"""`eval.name` / `ajet eval --name` names a report RUN/eval/eval_<name>.json: validated like
`project.name` (issue 69 §4), so it cannot write outside RUN/eval."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.cli import eval as eval_cmd
from ajet.config import ConfigError, load_config


def _conf(tmp_path: Path) -> Path:
    (tmp_path / "t.jsonl").write_text('{"task_id": "a", "question": "q"}\n')
    conf = tmp_path / "c.yaml"
    conf.write_text(f"project: {{exp_dir: {tmp_path / 'exp'}}}\nmodel: {{path: m}}\n"
                    "task_reader: {jsonl: {train_path: t.jsonl}}\n")
    return conf


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/x", "a/../../b", "~/x", "."])
def test_an_eval_name_that_leaves_run_eval_is_refused(tmp_path: Path, name: str) -> None:
    """Before: `ajet eval --name ../../escaped` wrote RUN/eval/eval_../../escaped.json, i.e. outside
    RUN/eval (and with more `..`, outside the run directory)."""
    result = CliRunner().invoke(eval_cmd.app, ["--conf", str(_conf(tmp_path)), "--name", name])
    assert result.exit_code == 2, result.output
    assert "eval.name" in result.output and "RUN/eval" in result.output
    with pytest.raises(ConfigError, match=r"eval\.name"):
        load_config(_conf(tmp_path), [f"eval.name='{name}'"], require_workflow=False)
    assert not (tmp_path / "exp").exists()


def test_evaluate_refuses_a_bad_name_before_loading_the_model(tmp_path: Path) -> None:
    from ajet.eval.runner import evaluate

    cfg = load_config(_conf(tmp_path), require_workflow=False)  # model.path "m" does not exist
    with pytest.raises(ConfigError, match=r"eval\.name \(--name\): '\.\./x' has an empty, '\.' or '\.\.' part"):
        evaluate(cfg, workflow=lambda task, model: 0.0, name="../x")
    assert load_config(_conf(tmp_path), ["eval.name=sft/step_40"], require_workflow=False).eval.name == "sft/step_40"
