"""`eval.split: test` / `ajet eval --split test`: the held-out test split of
`task_reader.jsonl.test_path` is evaluated (and only it), through the config and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.cli import eval as eval_cmd
from ajet.config import load_config
from ajet.config.schema import EvalSplit, JsonlReaderConfig, TaskReaderConfig
from ajet.errors import EvalError
from ajet.eval import runner as eval_runner
from ajet.task_reader import build_reader, split_tasks
from tests.integration.cli import ajet as fork_ajet

runner = CliRunner()

WORKFLOW = '''
async def echo(task: dict, model) -> float:
    client = model.openai_client()
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["main_query"]}])
    return 0.0
'''


def make_conf(tmp_path: Path, *, test: bool = True, model: str = "tiny") -> Path:
    for split, count in (("train", 3), ("val", 2), ("test", 4)):
        if split == "test" and not test:
            continue
        rows = [{"task_id": f"{split}-{i}", "question": f"{split} question {i}"} for i in range(count)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "agent.py").write_text(WORKFLOW)
    test_line = "test_path: test.jsonl, " if test else ""
    conf = tmp_path / "run.yaml"
    conf.write_text(f"""
project: {{name: split, exp_dir: {tmp_path / 'exp'}}}
model: {{path: {model}}}
workflow: {{target: agent.py:echo}}
task_reader: {{jsonl: {{train_path: train.jsonl, val_path: val.jsonl, {test_line}}}}}
rollout: {{n: 2, max_tokens: 4}}
eval: {{n: 1}}
logging: {{tensorboard: false}}
""")
    return conf


def test_split_tasks_picks_each_split_and_says_which_key_is_missing(tmp_path: Path) -> None:
    cfg = load_config(make_conf(tmp_path), require_workflow=False)
    reader = build_reader(cfg.task_reader, seed=0)
    for split, count in ((EvalSplit.train, 3), (EvalSplit.val, 2), (EvalSplit.test, 4)):
        tasks = split_tasks(reader, split)
        assert len(tasks) == count and all(t.task_id.startswith(split.value) for t in tasks)
    bare = build_reader(TaskReaderConfig(jsonl=JsonlReaderConfig(train_path=str(tmp_path / "train.jsonl"))), seed=0)
    with pytest.raises(EvalError, match=r"test split has no tasks; set task_reader\.jsonl\.test_path"):
        split_tasks(bare, EvalSplit.test)


def test_the_yaml_resolves_test_path_next_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = make_conf(tmp_path)
    monkeypatch.chdir("/")  # a path key is relative to the YAML, not to where ajet runs
    cfg = load_config(conf, ["eval.split=test"], require_workflow=False)
    assert cfg.eval.split == EvalSplit.test
    assert Path(cfg.task_reader.jsonl.test_path) == tmp_path / "test.jsonl"


def test_a_missing_test_file_fails_at_load(tmp_path: Path) -> None:
    conf = make_conf(tmp_path)
    (tmp_path / "test.jsonl").unlink()
    result = runner.invoke(eval_cmd.app, ["--conf", str(conf), "--split", "test"])
    assert result.exit_code != 0
    assert "task_reader.jsonl.test_path" in result.output and "Traceback" not in result.output


def test_cli_split_test_reaches_evaluate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_evaluate(cfg, **kwargs):  # noqa: ANN001, ANN202 - stands in for the real evaluation
        seen["split"] = cfg.eval.split
        seen["tasks"] = [t.task_id for t in split_tasks(build_reader(cfg.task_reader, seed=0), cfg.eval.split)]
        return eval_runner.EvalReport(path=tmp_path / "eval_x.json", name="x", model="m",
                                      metrics={"success/rate": 0.5}, results=[])

    monkeypatch.setattr(eval_runner, "evaluate", fake_evaluate)
    result = runner.invoke(eval_cmd.app, ["--conf", str(make_conf(tmp_path)), "--split", "test"])
    assert result.exit_code == 0, result.output
    assert seen == {"split": EvalSplit.test, "tasks": ["test-0", "test-1", "test-2", "test-3"]}
    bad = runner.invoke(eval_cmd.app, ["--conf", str(make_conf(tmp_path)), "--split", "holdout"])
    assert bad.exit_code != 0 and "eval.split" in bad.output and "Traceback" not in bad.output


def test_successful_only_needs_dialogs(tmp_path: Path) -> None:
    result = runner.invoke(eval_cmd.app, ["--conf", str(make_conf(tmp_path)), "--successful-only"])
    assert result.exit_code != 0 and "--dialogs" in result.output


def test_help_names_the_test_split() -> None:
    result = runner.invoke(eval_cmd.app, ["--help"], terminal_width=200)
    assert result.exit_code == 0 and "val, test or train" in result.output


@pytest.mark.integration
def test_ajet_eval_split_test_on_the_tiny_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_conf(tmp_path, model=str(tiny_model_dir))
    out = fork_ajet("eval", "--conf", str(conf), "--split", "test", "--name", "held_out", "--dialogs",
                    str(tmp_path / "dialogs.jsonl"), timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads((tmp_path / "exp" / "split" / "eval" / "eval_held_out.json").read_text())
    assert report["split"] == "test" and report["metrics"]["episodes"] == 4
    assert sorted(e["task_id"] for e in report["episodes"]) == ["test-0", "test-1", "test-2", "test-3"]
    # --dialogs: one SFT dialog per episode, in the format `ajet sft` reads.
    from ajet.sft.data import dialog_from_row

    rows = [json.loads(line) for line in (tmp_path / "dialogs.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    dialogs = [dialog_from_row(row, "x") for row in rows]
    assert sorted(d.messages[0]["content"] for d in dialogs) == [f"test question {i}" for i in range(4)]
    assert all(d.messages[-1]["role"] == "assistant" for d in dialogs)


DUO = '''
from ajet import Workflow, WorkflowOutput


class Duo(Workflow):
    async def execute(self, task, tuner):
        for role in ("solver", "critic"):
            await tuner.register_model(role)([{"role": "user", "content": task.main_query}])
        return WorkflowOutput(reward={"solver": 1.0, "critic": 0.0}, log_metrics={"moves": 3, "sandbox/timeouts": 1.0})
'''


@pytest.mark.integration
def test_ajet_eval_reports_each_role_and_the_workflows_metrics(tmp_path: Path, tiny_model_dir: Path) -> None:
    conf = make_conf(tmp_path, model=str(tiny_model_dir))
    (tmp_path / "duo.py").write_text(DUO)
    out = fork_ajet("eval", "--conf", str(conf), "--split", "val", "--name", "duo",
                    f"workflow.target={tmp_path / 'duo.py'}:Duo", timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    metrics = json.loads((tmp_path / "exp" / "split" / "eval" / "eval_duo.json").read_text())["metrics"]
    assert metrics["role/solver/reward"] == 1.0 and metrics["role/critic/reward"] == 0.0
    assert metrics["role/solver/calls"] == 1.0 and metrics["workflow/moves"] == 3.0
    assert metrics["sandbox/timeouts"] == 1.0  # a sandbox count keeps its name, as in training
