"""`ajet.tune(workflow, conf, backbone=...)` on the GPU backbones: their workers import the
workflow, so tune hands it over as `workflow.target` (issue 14's bug: `run` got a `workflow`
argument it did not accept)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ajet import Workflow, WorkflowOutput
from ajet.rollout.workflow_loader import WorkflowLoadError, as_workflow, load_workflow, target_of


class ModuleLevel(Workflow):
    async def execute(self, task, tuner) -> WorkflowOutput:
        return WorkflowOutput(reward=1.0)


async def module_level_fn(task: dict, tuner) -> float:
    return 1.0


def test_target_of_names_module_level_workflows_so_they_load_again() -> None:
    for obj in (ModuleLevel, module_level_fn):
        target = target_of(as_workflow(obj))
        assert target == f"{__name__}:{obj.__qualname__}"
        loaded = load_workflow(target)
        assert type(loaded) is type(as_workflow(obj))


def test_target_of_refuses_what_workers_cannot_import() -> None:
    async def local_fn(task: dict, tuner) -> float:
        return 0.0

    with pytest.raises(WorkflowLoadError, match="not defined at module level"):
        target_of(as_workflow(local_fn))


def test_target_of_a_script_run_as_main_is_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    script = tmp_path / "train_me.py"
    script.write_text("")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)

    async def fn(task: dict, tuner) -> float:
        return 0.0

    fn.__module__, fn.__qualname__ = "__main__", "fn"
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert target_of(as_workflow(fn)) == f"{script.resolve()}:fn"


@pytest.mark.parametrize("backbone, driver", [("trinity", "run_trinity"), ("verl", "run_verl")])
def test_tune_on_a_gpu_backbone_passes_the_workflow_as_its_target(
        stub_run_conf, monkeypatch: pytest.MonkeyPatch, backbone: str, driver: str) -> None:
    import importlib

    import ajet

    package = importlib.import_module(f"ajet.backbones.{backbone}")
    monkeypatch.setattr(package, "require_gpus", lambda *args: None)
    seen = []
    monkeypatch.setattr(package, driver, lambda cfg, resume=False: seen.append(cfg))
    ajet.tune(ModuleLevel, stub_run_conf(), backbone=backbone)
    (cfg,) = seen
    assert cfg.workflow.target == f"{__name__}:ModuleLevel"
