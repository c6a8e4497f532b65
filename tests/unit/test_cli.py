"""The CLI: fast help without heavy imports, exit code 2 and a message for bad input."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.backbones.registry import get_backbone
from ajet.cli import train as train_cmd
from ajet.config.choices import Backbone

runner = CliRunner()
HEAVY = ("torch", "ray", "agentscope", "transformers", "vllm", "peft")

# A workflow that imports and loads (what --dry-run checks).
STUB_WORKFLOW = "from ajet import Workflow\n\n\nclass W(Workflow):\n    async def execute(self, task, tuner): ...\n"


def test_help_does_not_import_heavy_packages() -> None:
    code = (
        "import sys, json\n"
        "from ajet.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "--conf" in out.stdout and "--backbone" in out.stdout and "ajet config" in out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_import_ajet_is_light() -> None:
    code = f"import sys, json, ajet, ajet.config; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _conf(tmp_path: Path, body: str) -> Path:
    (tmp_path / "agent.py").write_text(STUB_WORKFLOW)  # --dry-run imports it
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    path = tmp_path / "run.yaml"
    path.write_text(
        "workflow:\n  target: agent.py:W\ntask_reader:\n  jsonl:\n    train_path: train.jsonl\n" + body
    )
    return path


def test_unknown_key_exits_2_with_path(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "trainer:\n  lrr: 0.1\n")
    result = runner.invoke(train_cmd.app, ["--conf", str(conf)])
    assert result.exit_code == 2
    assert "trainer.lrr" in result.output and str(conf) in result.output
    assert "Traceback" not in result.output


def test_wrong_type_exits_2(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "rollout:\n  temperature: hot\n")
    result = runner.invoke(train_cmd.app, ["--conf", str(conf)])
    assert result.exit_code == 2 and "rollout.temperature" in result.output


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(train_cmd.app, ["--conf", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "missing.yaml" in result.output


def test_bad_backbone_exits_2(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "")
    result = runner.invoke(train_cmd.app, ["--conf", str(conf), "--backbone", "megatron"])
    assert result.exit_code == 2 and "megatron" in result.output and "debug" in result.output


def test_backbone_names_are_one_list() -> None:
    """The CLI's --backbone choices and the registry both use `ajet.config.choices.Backbone`."""
    for name in Backbone:
        assert importlib.util.find_spec(f"ajet.backbones.{name.value}") is not None, name
    with pytest.raises(ValueError, match=re.escape(f"choose one of {sorted(Backbone.__members__)}")):
        get_backbone("megatron")


def test_dry_run_prints_resolved_config_with_overrides(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "")
    result = runner.invoke(
        train_cmd.app, ["--conf", str(conf), "--dry-run", "rollout.n=6", "--exp-dir", str(tmp_path / "x")]
    )
    assert result.exit_code == 0, result.output
    assert "'n': 6" in result.output and f"exp_dir: {tmp_path / 'x'}" in result.output


def test_ajet_script_entry_point_runs(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "")
    out = subprocess.run(
        [sys.executable, "-m", "ajet.cli.main", "--conf", str(conf), "--dry-run", "trainer.lr=0.5"],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "lr: 0.5" in out.stdout


def test_dry_run_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    """`--dry-run` checks the config, the workflow, the judge and the model path without loading a model."""
    conf = _conf(tmp_path, "")
    code = (
        "import sys, json\n"
        "from ajet.cli.main import main\n"
        f"try:\n    main(['--conf', {str(conf)!r}, '--dry-run'])\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "# checked: workflow" in out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_fresh_and_resume_together_exit_2(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "")
    result = runner.invoke(train_cmd.app, ["--conf", str(conf), "--fresh", "--resume"])
    assert result.exit_code == 2 and "--fresh" in result.output and "--resume" in result.output


def test_fresh_moves_the_earlier_run_aside_before_the_new_one_starts(tmp_path: Path, monkeypatch) -> None:
    import ajet.pipeline

    conf = _conf(tmp_path, "project:\n  name: demo\n")
    earlier = tmp_path / "exp" / "demo"
    (earlier / "stages" / "02_sft").mkdir(parents=True)
    (earlier / "pipeline.json").write_text('{"stages": []}')
    seen: list[bool] = []
    monkeypatch.setattr(ajet.pipeline, "run", lambda cfg, runner, **kw: seen.append(earlier.exists()))
    result = runner.invoke(train_cmd.app, ["--conf", str(conf), "--fresh", "--exp-dir", str(tmp_path / "exp")])
    assert result.exit_code == 0, result.output
    assert seen == [False]  # the run started in an empty place
    (kept,) = [p for p in (tmp_path / "exp").iterdir() if p.name.startswith("demo.")]
    assert (kept / "pipeline.json").read_text() == '{"stages": []}' and (kept / "stages" / "02_sft").is_dir()
    assert str(kept) in result.output
