"""load_workflow / as_workflow / validate_workflow_function: what loads, and each error's message."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from ajet.errors import BadOutputError
from ajet.rollout.workflow_loader import (
    FunctionWorkflow,
    WorkflowLoadError,
    WorkflowSignatureError,
    as_workflow,
    load_workflow,
    validate_workflow_function,
)
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

WORKFLOW_SOURCE = """
from ajet.workflow import Workflow, WorkflowOutput

class EchoWorkflow(Workflow):
    trainable_targets = ["solver"]

    async def execute(self, task, tuner):
        return WorkflowOutput(reward=float(len(task.main_query)))

async def solve(task: dict, model) -> float:
    return 0.5

class NotAWorkflow:
    async def execute(self, task, tuner):
        return None

class NoExecute(Workflow):
    pass

def sync_solve(task, model):
    return 1.0

NUMBER = 3
"""


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path holding `wf_mod_c2.py` (unique name: no clash with other tests)."""
    write(tmp_path / "wf_mod_c2.py", WORKFLOW_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


# ------------------------------------------------------------------ module and file targets


def test_module_target_loads_a_workflow_subclass_instance(module_dir: Path) -> None:
    wf = load_workflow("wf_mod_c2:EchoWorkflow")
    assert type(wf).__name__ == "EchoWorkflow" and isinstance(wf, Workflow)
    assert type(wf).trainable_targets == ["solver"]
    out = asyncio.run(wf.execute(WorkflowTask(task_id="t", main_query="abc"), None))
    assert out.reward == 3.0


def test_module_target_wraps_an_async_function(module_dir: Path) -> None:
    wf = load_workflow("wf_mod_c2:solve")
    assert isinstance(wf, FunctionWorkflow) and wf.name == "solve"
    out = asyncio.run(wf.execute(WorkflowTask(task_id="t"), None))
    assert out == WorkflowOutput(reward=0.5)


def test_file_target_loads_and_can_import_sibling_files(tmp_path: Path) -> None:
    write(tmp_path / "helpers_c2_sibling.py", "BONUS = 2.0\n")
    path = write(
        tmp_path / "agent.py",
        WORKFLOW_SOURCE + "\nfrom helpers_c2_sibling import BONUS\n"
        "class Bonus(EchoWorkflow):\n"
        "    async def execute(self, task, tuner):\n"
        "        return WorkflowOutput(reward=BONUS)\n",
    )
    wf = load_workflow(f"{path}:Bonus")
    assert asyncio.run(wf.execute(WorkflowTask(task_id="t"), None)).reward == 2.0
    # Loading the same file again reuses the module (same class object).
    assert type(load_workflow(f"{path}:Bonus")) is type(wf)


def test_file_target_function(tmp_path: Path) -> None:
    path = write(tmp_path / "fn_agent.py", WORKFLOW_SOURCE)
    assert isinstance(load_workflow(f"{path}:solve"), FunctionWorkflow)


# ------------------------------------------------------------------ load errors


@pytest.mark.parametrize("target", ["no_colon_here", "module:", ":Name"])
def test_malformed_target_shows_the_expected_form(target: str) -> None:
    with pytest.raises(WorkflowLoadError, match="package.module:ClassName") as err:
        load_workflow(target)
    assert target in str(err.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(WorkflowLoadError, match="file not found") as err:
        load_workflow(f"{missing}:Thing")
    assert str(missing) in str(err.value)


def test_module_import_error_keeps_the_original_message(module_dir: Path) -> None:
    write(module_dir / "wf_broken_c2.py", "import definitely_not_installed_pkg_c2\n")
    with pytest.raises(WorkflowLoadError) as err:
        load_workflow("wf_broken_c2:X")
    msg = str(err.value)
    assert "wf_broken_c2:X" in msg and "definitely_not_installed_pkg_c2" in msg
    assert "ModuleNotFoundError" in msg


def test_unknown_module_is_named() -> None:
    with pytest.raises(WorkflowLoadError, match="no_such_module_c2"):
        load_workflow("no_such_module_c2.sub:Wf")


def test_file_with_an_error_reports_it(tmp_path: Path) -> None:
    path = write(tmp_path / "bad_syntax.py", "def broken(:\n")
    with pytest.raises(WorkflowLoadError, match="SyntaxError") as err:
        load_workflow(f"{path}:broken")
    assert str(path) in str(err.value)
    path2 = write(tmp_path / "raises_on_import.py", "raise RuntimeError('config missing: FOO')\n")
    with pytest.raises(WorkflowLoadError, match="RuntimeError: config missing: FOO"):
        load_workflow(f"{path2}:X")


def test_missing_attribute_lists_what_the_module_defines(module_dir: Path) -> None:
    with pytest.raises(WorkflowLoadError, match="has no attribute 'EchoWorkflw'") as err:
        load_workflow("wf_mod_c2:EchoWorkflw")
    assert "EchoWorkflow" in str(err.value)


def test_class_that_is_not_a_workflow(module_dir: Path) -> None:
    with pytest.raises(WorkflowLoadError, match="not a subclass of ajet.Workflow"):
        load_workflow("wf_mod_c2:NotAWorkflow")


def test_non_callable_attribute(module_dir: Path) -> None:
    with pytest.raises(WorkflowLoadError, match="got int, not a workflow"):
        load_workflow("wf_mod_c2:NUMBER")


def test_workflow_without_execute(module_dir: Path) -> None:
    with pytest.raises(WorkflowLoadError, match="does not implement execute"):
        load_workflow("wf_mod_c2:NoExecute")


def test_sync_function_target_is_a_signature_error_naming_the_target(module_dir: Path) -> None:
    with pytest.raises(WorkflowSignatureError) as err:
        load_workflow("wf_mod_c2:sync_solve")
    msg = str(err.value)
    assert "wf_mod_c2:sync_solve" in msg and "async def" in msg
    assert isinstance(err.value, WorkflowLoadError)  # callers may catch one type


def test_async_generator_execute_is_rejected() -> None:
    class Gen(Workflow):
        async def execute(self, task, tuner):  # type: ignore[override]
            yield WorkflowOutput(reward=1.0)

    with pytest.raises(WorkflowLoadError, match="async generator"):
        as_workflow(Gen)


def test_sync_execute_is_accepted() -> None:
    class SyncWf(Workflow):
        def execute(self, task, tuner):  # type: ignore[override]
            return WorkflowOutput(reward=1.0)

    assert isinstance(as_workflow(SyncWf), SyncWf)


def test_instance_is_returned_as_is() -> None:
    class Wf(Workflow):
        async def execute(self, task, tuner):  # type: ignore[override]
            return WorkflowOutput(reward=1.0)

    wf = Wf(name="mine")
    assert as_workflow(wf) is wf


def test_constructor_failure_is_reported() -> None:
    class Needs(Workflow):
        def __init__(self, x):  # noqa: ANN001
            raise ValueError("needs x")

        async def execute(self, task, tuner):  # type: ignore[override]
            return WorkflowOutput(reward=1.0)

    with pytest.raises(WorkflowLoadError, match="Needs\\(\\) failed"):
        as_workflow(Needs)


# ------------------------------------------------------------------ function signatures


async def good(task: dict, model) -> float:  # noqa: ANN001
    return 1.0


async def good_tuner(task, tuner) -> WorkflowOutput:  # noqa: ANN001
    return WorkflowOutput(reward=1.0)


async def good_union(task: dict[str, object], model) -> float | WorkflowOutput:  # noqa: ANN001
    return 1.0


def sync_fn(task: dict, model) -> float:  # noqa: ANN001
    return 1.0


async def missing_model(task: dict) -> float:
    return 1.0


async def no_params() -> float:
    return 1.0


async def extra_param(task: dict, model, judge) -> float:  # noqa: ANN001
    return 1.0


async def wrong_return(task: dict, model) -> str:  # noqa: ANN001
    return "1.0"


async def optional_return(task: dict, model) -> float | None:  # noqa: ANN001
    return 1.0


async def wrong_names(query: dict, llm) -> float:  # noqa: ANN001
    return 1.0


async def wrong_task_annotation(task: str, model) -> float:  # noqa: ANN001
    return 1.0


async def var_args(task: dict, *args) -> float:  # noqa: ANN001
    return 1.0


async def kw_only(task: dict, model, *, temperature=1.0) -> float:  # noqa: ANN001
    return 1.0


async def agen(task: dict, model):  # noqa: ANN001
    yield 1.0


@pytest.mark.parametrize("fn", [good, good_tuner, good_union])
def test_good_signatures_pass(fn) -> None:  # noqa: ANN001
    validate_workflow_function(fn)


def test_annotations_are_read_as_text_under_future_annotations() -> None:
    # This module uses `from __future__ import annotations`: every annotation is a string.
    assert isinstance(good.__annotations__["return"], str)
    validate_workflow_function(good_union)
    with pytest.raises(WorkflowSignatureError, match="`str`"):
        validate_workflow_function(wrong_return)


def test_real_type_annotations_are_checked_too() -> None:
    async def real(task, model):  # noqa: ANN001
        return 1.0

    real.__annotations__ = {"task": dict, "return": float | WorkflowOutput}
    validate_workflow_function(real)
    real.__annotations__ = {"task": dict, "return": float | None}
    with pytest.raises(WorkflowSignatureError, match="return annotation"):
        validate_workflow_function(real)


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (sync_fn, "sync function"),
        (missing_model, "missing parameter(s): model"),
        (no_params, "missing parameter(s): task, model"),
        (extra_param, "extra parameter(s): judge"),
        (wrong_return, "return annotation is `str`"),
        (optional_return, "return annotation is `float | None`"),
        (wrong_names, "name it `task`"),
        (wrong_task_annotation, "`task` is annotated `str`"),
        (var_args, "`*args` is not allowed"),
        (kw_only, "keyword-only parameter `temperature`"),
        (agen, "async generator"),
    ],
)
def test_bad_signatures_say_what_is_wrong(fn, expected: str) -> None:  # noqa: ANN001
    with pytest.raises(WorkflowSignatureError) as err:
        validate_workflow_function(fn)
    msg = str(err.value)
    assert expected in msg
    assert fn.__name__ in msg
    assert "async def fn(task: dict, model) -> float:" in msg


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(WorkflowSignatureError) as err:
        validate_workflow_function(wrong_names)
    assert "name it `task`" in str(err.value) and "name it `model`" in str(err.value)


def test_async_callable_object_is_accepted() -> None:
    class Solver:
        async def __call__(self, task: dict, model) -> float:  # noqa: ANN001
            return 1.0

    assert isinstance(as_workflow(Solver()), FunctionWorkflow)


# ------------------------------------------------------------------ FunctionWorkflow at run time


def test_function_workflow_passes_task_dict_with_metadata() -> None:
    seen = {}

    async def solve(task: dict, model) -> float:  # noqa: ANN001
        seen.update(task)
        seen["model"] = model
        return 1

    wf = FunctionWorkflow(solve)
    task = WorkflowTask(
        task_id="t1", main_query="2+3?", metadata={"answer": "5", "task_id": "shadowed"}
    )
    out = asyncio.run(wf.execute(task, "the-tuner"))
    assert out.reward == 1.0 and isinstance(out.reward, float)
    assert seen["task_id"] == "t1" and seen["main_query"] == "2+3?" and seen["answer"] == "5"
    assert seen["metadata"] == {"answer": "5", "task_id": "shadowed"}
    assert seen["model"] == "the-tuner"


@pytest.mark.parametrize(
    ("value", "expected"), [(None, "NoneType"), ("1.0", "str"), (True, "float(...)")]
)
def test_function_workflow_rejects_non_reward_returns(value, expected: str) -> None:  # noqa: ANN001
    async def solve(task: dict, model):  # noqa: ANN001
        return value

    with pytest.raises(
        BadOutputError, match="must return a float reward or a WorkflowOutput"
    ) as err:
        asyncio.run(FunctionWorkflow(solve).execute(WorkflowTask(task_id="t"), None))
    assert expected in str(err.value)
