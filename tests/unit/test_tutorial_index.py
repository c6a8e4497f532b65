"""Every tutorial example is complete and indexed: README, YAML, a tutorial-marked test, a line
with its command in tutorial/README.md; its configs and workflows load; its data regenerates."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[2] / "tutorial"
EXAMPLES = sorted(p for p in TUTORIAL.glob("example_*") if p.is_dir())
INDEX = (TUTORIAL / "README.md").read_text()
ISSUE_7_EXAMPLES = (
    "example_math_agent", "example_function_workflow", "example_countdown", "example_frozenlake",
    "example_werewolves", "example_learn2ask", "example_appworld",
)


def test_there_are_examples() -> None:
    assert set(ISSUE_7_EXAMPLES) <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_has_readme_yaml_and_tutorial_test(example: Path) -> None:
    readme = example / "README.md"
    assert readme.is_file(), f"{example.name} has no README.md"
    text = readme.read_text()
    assert f"tutorial/{example.name}/" in text, f"{readme}: show the command that runs it"
    if example.name in ISSUE_7_EXAMPLES:  # RL examples: the debug run and the GPU backbones
        assert "--backbone=debug" in text or "ajet.tune" in text
        assert "trinity" in text and "verl" in text, f"{readme}: say how it runs on a GPU backbone"
    assert list(example.glob("*.yaml")), f"{example.name} has no YAML"
    tests = list(example.glob("test_*.py"))
    assert tests, f"{example.name} has no test_*.py"
    assert any("pytest.mark.tutorial" in t.read_text() for t in tests), f"{example.name}: no @pytest.mark.tutorial test"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_is_indexed_with_its_command(example: Path) -> None:
    lines = [line for line in INDEX.splitlines() if f"[{example.name}]" in line]
    assert len(lines) == 1, f"tutorial/README.md needs exactly one table line for {example.name}"
    commands = re.findall(r"`([^`]*(?:ajet --conf|python) [^`]*)`", lines[0])
    assert commands, f"the index line of {example.name} has no command"
    for command in commands:
        for path in re.findall(rf"tutorial/{example.name}/[\w.]+", command):
            assert (TUTORIAL.parent / path).is_file(), f"the index names {path}, which does not exist"
        assert re.search(rf"tutorial/{example.name}/\S+\.(yaml|py)", command), command


def _yamls() -> list[Path]:
    return sorted(p for example in EXAMPLES for p in example.glob("*.yaml"))


@pytest.mark.parametrize("conf", _yamls(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_and_workflow_load(conf: Path) -> None:
    from ajet.config import load_config
    from ajet.rollout.workflow_loader import load_workflow
    from ajet.workflow import Workflow

    cfg = load_config(conf, require_workflow=False)
    assert cfg.project.name, conf
    readme = conf.parent / "README.md"
    assert readme.is_file() and conf.name in readme.read_text(), f"{conf.parent.name}/README.md never names {conf.name}"
    if cfg.workflow.target:
        assert isinstance(load_workflow(cfg.workflow.target), Workflow)
    else:  # a function workflow run through ajet.tune, or clients of `ajet serve`: named in the comments
        assert "ajet.tune" in conf.read_text() or "ajet serve" in conf.read_text()


@pytest.mark.parametrize(
    "example", [p for p in EXAMPLES if (p / "make_data.py").is_file()], ids=lambda p: p.name
)
def test_make_data_regenerates_the_shipped_data(example: Path, tmp_path: Path) -> None:
    # In a copy of tutorial/ (make_data may read sibling examples), so the real files are
    # never written by a test.
    copy = tmp_path / "tutorial"
    shutil.copytree(TUTORIAL, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for stale in (copy / example.name).glob("*.jsonl"):
        stale.unlink()
    result = subprocess.run(
        [sys.executable, str(copy / example.name / "make_data.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    written = sorted(p.name for p in (copy / example.name).glob("*.jsonl"))
    assert written == sorted(p.name for p in example.glob("*.jsonl")), f"{example.name}: make_data.py writes {written}"
    for name in written:
        assert (copy / example.name / name).read_text() == (example / name).read_text(), f"{example.name}/{name} is stale"


def test_each_tutorial_readme_opens_with_its_four_lines() -> None:
    """Issue 56: what it teaches, the one command, what to expect, where to look next: in that
    order, right under the title."""
    labels = ["- **What it teaches:**", "- **The command:**", "- **What to expect:**", "- **Where next:**"]
    for readme in sorted(TUTORIAL.glob("example_*/README.md")):
        head = readme.read_text().split("\n## ", 1)[0]
        where = [head.find(label) for label in labels]
        assert all(i >= 0 for i in where) and where == sorted(where), f"{readme}: {dict(zip(labels, where, strict=True))}"
