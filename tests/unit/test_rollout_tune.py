"""ajet.tune: the workflow is checked before the config or any model loads; then the backbone runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import ajet.backbones.registry as registry
from ajet.backbones import debug as debug_backbone
from ajet.config import ConfigError
from ajet.config.schema import AjetConfig
from ajet.rollout.workflow_loader import FunctionWorkflow, WorkflowLoadError, WorkflowSignatureError
from ajet.tune import tune
from ajet.workflow import Workflow, WorkflowOutput

HEAVY = ("torch", "transformers", "agentscope", "ray", "peft")


@pytest.mark.parametrize(
    ("bad_fn", "expected"),
    [
        ("def bad(task: dict, model) -> float:\n    return 1.0", "sync function"),
        ("async def bad(task: dict) -> float:\n    return 1.0", "missing parameter(s): model"),
        (
            "async def bad(task: dict, model, extra) -> float:\n    return 1.0",
            "extra parameter(s): extra",
        ),
        ("async def bad(task: dict, model) -> str:\n    return '1'", "return annotation is `str`"),
    ],
)
def test_bad_function_fails_before_config_and_without_heavy_imports(
    bad_fn: str, expected: str
) -> None:
    # The config path does not exist: reaching the config loader would raise ConfigError instead.
    script = textwrap.dedent(
        """
        import json, sys
        import ajet
        from ajet.rollout import WorkflowSignatureError
        {bad_fn}
        try:
            ajet.tune(bad, "/nonexistent/conf.yaml")
            outcome = "no error"
        except WorkflowSignatureError as exc:
            outcome = str(exc)
        print(json.dumps({{"outcome": outcome, "heavy": [m for m in {heavy} if m in sys.modules]}}))
        """
    ).format(bad_fn=textwrap.indent(bad_fn, "        ").strip(), heavy=HEAVY)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert expected in report["outcome"]
    assert "async def fn(task: dict, model) -> float:" in report["outcome"]
    assert report["heavy"] == []


class FakeBackbone:
    CAPABILITIES = debug_backbone.CAPABILITIES

    def __init__(self, problems: list[tuple[str, str]] | None = None) -> None:
        self.problems = problems or []
        self.calls: list[dict[str, Any]] = []

    def check_config(self, cfg: AjetConfig) -> list[tuple[str, str]]:
        return self.problems

    def translate(self, cfg: AjetConfig, *, resume: bool = False) -> str | None:
        return None

    def run(self, cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: Workflow) -> None:
        self.calls.append(
            {"cfg": cfg, "with_ray": with_ray, "resume": resume, "workflow": workflow}
        )


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  total_steps: 3\nrollout:\n  n: 2\n", encoding="utf-8")
    return path


@pytest.fixture
def backbone(monkeypatch: pytest.MonkeyPatch) -> FakeBackbone:
    fake = FakeBackbone()
    names: list[str] = []
    monkeypatch.setattr(registry, "get_backbone", lambda name: names.append(name) or fake)
    fake.names = names  # type: ignore[attr-defined]
    return fake


async def solve(task: dict, model) -> float:  # noqa: ANN001
    return 1.0


def test_function_is_wrapped_and_handed_to_the_backbone(conf: Path, backbone: FakeBackbone) -> None:
    tune(solve, conf, overrides=["trainer.total_steps=7"], with_ray=True, resume=True)
    (call,) = backbone.calls
    assert isinstance(call["workflow"], FunctionWorkflow) and call["workflow"].fn is solve
    assert call["cfg"].trainer.total_steps == 7 and call["cfg"].rollout.n == 2
    assert (call["with_ray"], call["resume"]) == (True, True)
    assert backbone.names == ["debug"]  # type: ignore[attr-defined]


def test_workflow_class_is_instantiated(conf: Path, backbone: FakeBackbone) -> None:
    class Mine(Workflow):
        async def execute(self, task, tuner):  # type: ignore[override]  # noqa: ANN001
            return WorkflowOutput(reward=1.0)

    tune(Mine, str(conf), backbone="verl")
    assert isinstance(backbone.calls[0]["workflow"], Mine)
    assert backbone.names == ["verl"]  # type: ignore[attr-defined]


def test_bad_workflow_never_reaches_the_backbone(conf: Path, backbone: FakeBackbone) -> None:
    def sync_solve(task: dict, model) -> float:  # noqa: ANN001
        return 1.0

    with pytest.raises(WorkflowSignatureError):
        tune(sync_solve, conf)
    with pytest.raises(WorkflowLoadError, match="not a subclass"):
        tune(dict, conf)
    assert backbone.calls == [] and backbone.names == []  # type: ignore[attr-defined]


def test_backbone_config_problems_raise_config_error(conf: Path, backbone: FakeBackbone) -> None:
    backbone.problems = [("rollout.n", "too small for this backbone")]
    with pytest.raises(ConfigError, match="rollout.n: too small"):
        tune(solve, conf)
    assert backbone.calls == []


def test_bad_config_raises_config_error(tmp_path: Path, backbone: FakeBackbone) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  total_stepz: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="total_stepz"):
        tune(solve, path)


def test_ajet_tune_is_callable_however_it_was_imported(conf: Path, backbone: FakeBackbone) -> None:
    import ajet
    import ajet.tune as tune_module

    assert callable(tune_module)
    ajet.tune(solve, conf)
    assert len(backbone.calls) == 1
