"""Turn what the user gives (a config target, a class, an instance, a function) into a `Workflow`.

Everything here runs before any model loads, so a wrong target or a wrong function
signature fails in milliseconds with an error that names what is wrong and shows
the expected form. Nothing heavy is imported.

Accepted workflows:
- a `Workflow` subclass or instance, whose `execute(task, tuner)` is `async def`
  (or a plain `def`: it then runs in a worker thread, see `ajet.rollout.runner`);
- a function `async def fn(task: dict, model) -> float:` (wrapped in `FunctionWorkflow`).
  The second parameter may also be named `tuner`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import numbers
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr

from ajet.errors import BadOutputError, WorkflowLoadError, WorkflowSignatureError
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

logger = logging.getLogger(__name__)

EXPECTED_TARGET = "'package.module:ClassName' or 'path/to/file.py:ClassName'"
EXPECTED_SIGNATURE = "async def fn(task: dict, model) -> float:"
# What a caller may hand over as the workflow (`ajet.tune(workflow=...)`): a Workflow subclass or
# instance, or a function of EXPECTED_SIGNATURE; `as_workflow` checks it and says what is wrong.
WorkflowArg = Workflow | type[Workflow] | Callable[..., object]
_SECOND_PARAM_NAMES = ("model", "tuner")
_TASK_ANNOTATIONS = {
    "dict",
    "Dict",
    "Mapping",
    "Any",
    "typing.Any",
    "typing.Dict",
    "typing.Mapping",
}
_RETURN_ANNOTATIONS = {"float", "int", "WorkflowOutput"}


# --------------------------------------------------------------------------- functions


def validate_workflow_function(fn: Callable[..., Any]) -> None:
    """Check `fn` is `async def fn(task: dict, model) -> float` (or `-> WorkflowOutput`).

    Raises `WorkflowSignatureError` listing every problem found.
    """
    name = str(getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", repr(fn)))
    target = fn
    if isinstance(target, functools.partial):
        target = target.func
    plain = inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)
    if callable(target) and not plain:
        target = type(target).__call__  # an object with an async __call__
    if inspect.isasyncgenfunction(target):
        _signature_error(
            name, ["it is an async generator (it uses `yield`); return the reward instead"]
        )
    if not inspect.iscoroutinefunction(target):
        kind = "a class" if inspect.isclass(target) else "a sync function (`def`)"
        _signature_error(name, [f"it is {kind}; a workflow function must be `async def`"])
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        _signature_error(name, [f"its signature cannot be read ({exc})"])
    problems = _parameter_problems(list(signature.parameters.values()))
    returns = signature.return_annotation
    if returns is not inspect.Signature.empty and not _annotation_ok(returns, _RETURN_ANNOTATIONS):
        problems.append(
            f"return annotation is `{_annotation_text(returns)}`; it must be `float` "
            "(the reward) or `WorkflowOutput` (reward plus is_success/metadata/log_metrics)"
        )
    if problems:
        _signature_error(name, problems)


def _parameter_problems(params: list[inspect.Parameter]) -> list[str]:
    problems = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind == p.VAR_POSITIONAL else "**"
            problems.append(f"`{star}{p.name}` is not allowed; take exactly (task, model)")
        elif p.kind == p.KEYWORD_ONLY:
            problems.append(
                f"keyword-only parameter `{p.name}` is not allowed; take exactly (task, model)"
            )
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        missing = ["task", "model"][len(positional) :]
        problems.append(f"missing parameter(s): {', '.join(missing)} (it takes {len(positional)})")
    elif len(positional) > 2:
        extra = ", ".join(p.name for p in positional[2:])
        problems.append(f"extra parameter(s): {extra}; it must take exactly two, (task, model)")
    if positional and positional[0].name != "task":
        problems.append(f"first parameter is `{positional[0].name}`; name it `task`")
    if len(positional) >= 2 and positional[1].name not in _SECOND_PARAM_NAMES:
        problems.append(f"second parameter is `{positional[1].name}`; name it `model` (or `tuner`)")
    if positional:
        ann = positional[0].annotation
        if ann is not inspect.Parameter.empty and not _annotation_ok(ann, _TASK_ANNOTATIONS):
            problems.append(
                f"`task` is annotated `{_annotation_text(ann)}`; it receives a dict "
                "(annotate `task: dict`, or subclass ajet.Workflow to receive a WorkflowTask)"
            )
    return problems


def _annotation_text(ann: Any) -> str:
    if isinstance(ann, str):
        return ann
    if isinstance(ann, type) and not typing.get_args(ann):
        return ann.__name__
    return str(ann).replace("typing.", "")


def _annotation_ok(ann: Any, allowed: set[str]) -> bool:
    """True when every member of the (possibly union / parametrised) annotation is allowed."""
    return all(name in allowed for name in _annotation_names(ann))


def _annotation_names(ann: Any) -> list[str]:
    """Base names of a union's members: `float | None` -> ["float", "None"]."""
    if isinstance(ann, str):  # `from __future__ import annotations`: read the text
        return _names_from_text(ann)
    if ann is None or ann is type(None):
        return ["None"]
    origin = typing.get_origin(ann)
    if origin is typing.Union or isinstance(ann, types.UnionType):
        return [n for arg in typing.get_args(ann) for n in _annotation_names(arg)]
    base = origin if origin is not None else ann
    return [getattr(base, "__name__", None) or getattr(base, "_name", None) or str(base)]


def _names_from_text(text: str) -> list[str]:
    text = text.strip()
    for wrapper in ("Optional[", "typing.Optional[", "Union[", "typing.Union["):
        if text.startswith(wrapper) and text.endswith("]"):
            names = [
                n
                for part in _split_top(text[len(wrapper) : -1], ",")
                for n in _names_from_text(part)
            ]
            return names + (["None"] if "Optional" in wrapper else [])
    parts = _split_top(text, "|")
    if len(parts) > 1:
        return [n for part in parts for n in _names_from_text(part)]
    return [text.split("[", 1)[0].rpartition(".")[2]]


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside brackets: "dict[str, int] | None" -> ["dict[str, int] ", " None"]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _signature_error(name: str, problems: list[str]) -> typing.NoReturn:
    lines = "\n".join(f"  - {p}" for p in problems)
    raise WorkflowSignatureError(
        f"workflow function `{name}` has the wrong signature:\n{lines}\n"
        f"Expected:\n  {EXPECTED_SIGNATURE}\n"
        "      ...\n      return reward  # a float; or a WorkflowOutput"
    )


def task_as_dict(task: WorkflowTask) -> dict[str, Any]:
    """The dict a workflow function receives: the task's metadata keys (e.g. the dataset
    row's "answer") with the task fields (task_id, main_query, ...) on top."""
    fields = task.model_dump()
    return {**task.metadata, **fields}


def output_from_return(value: Any) -> WorkflowOutput:
    """A function workflow's return value as a `WorkflowOutput` (raises `BadOutputError`)."""
    if isinstance(value, WorkflowOutput):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise BadOutputError(
                f"the workflow function returned reward {value!r}; a reward must be a finite "
                "number (the episode is not trained on)"
            )
        return WorkflowOutput(reward=float(value))
    hint = " (use float(...) to return a bool as a reward)" if isinstance(value, bool) else ""
    raise BadOutputError(
        f"the workflow function returned {type(value).__name__} {value!r:.80}; "
        f"it must return a float reward or a WorkflowOutput{hint}"
    )


class FunctionWorkflow(Workflow):
    """Wraps `async def fn(task: dict, model) -> float` as a `Workflow`."""

    _fn: Callable[..., Any] = PrivateAttr()

    def __init__(self, fn: Callable[..., Any], **data: Any) -> None:
        validate_workflow_function(fn)
        data.setdefault("name", getattr(fn, "__name__", "workflow"))
        super().__init__(**data)
        self._fn = fn

    @property
    def fn(self) -> Callable[..., Any]:
        return self._fn

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        return output_from_return(await self._fn(task_as_dict(task), tuner))


# --------------------------------------------------------------------------- classes / objects


def as_workflow(obj: Any, *, origin: str = "") -> Workflow:
    """A `Workflow` instance from a subclass, an instance or an async function."""
    where = f"{origin}: " if origin else ""
    if isinstance(obj, Workflow):
        _check_execute(type(obj), where)
        return obj
    if inspect.isclass(obj):
        if not issubclass(obj, Workflow):
            raise WorkflowLoadError(
                f"{where}{obj.__qualname__} is a class but not a subclass of ajet.Workflow. "
                "Subclass it: `class MyWorkflow(Workflow): async def execute(self, task, tuner): ...`, "
                f"or pass a function `{EXPECTED_SIGNATURE}`"
            )
        _check_execute(obj, where)
        try:
            return obj()
        except Exception as exc:  # user code: re-raise with the target named
            raise WorkflowLoadError(
                f"{where}{obj.__qualname__}() failed: {type(exc).__name__}: {exc}"
            ) from exc
    if callable(obj):
        try:
            return FunctionWorkflow(obj)
        except WorkflowSignatureError as exc:
            if where:
                raise WorkflowSignatureError(f"{where}{exc}") from None
            raise
    raise WorkflowLoadError(
        f"{where}got {type(obj).__name__}, not a workflow. Expected a subclass of ajet.Workflow "
        f"or a function `{EXPECTED_SIGNATURE}`"
    )


def _check_execute(cls: type[Workflow], where: str) -> None:
    execute = getattr(cls, "execute", None)
    if execute is Workflow.execute or not callable(execute):
        raise WorkflowLoadError(
            f"{where}{cls.__qualname__} does not implement execute; define "
            "`async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:`"
        )
    if inspect.isasyncgenfunction(execute):
        raise WorkflowLoadError(
            f"{where}{cls.__qualname__}.execute is an async generator (it uses `yield`); "
            "it must `return` a WorkflowOutput"
        )
    if not inspect.iscoroutinefunction(execute):
        logger.info(
            "%s.execute is a plain `def`; each episode runs it in a worker thread", cls.__qualname__
        )


# --------------------------------------------------------------------------- config targets


def target_of(workflow: Workflow) -> str:
    """The `workflow.target` string that loads `workflow` in another process (the GPU backbones'
    workers): `module:QualName`, or `/path/file.py:QualName` for a script run as `__main__`.
    Only module-level classes and functions can be named; anything else is a WorkflowLoadError."""
    obj: Any = workflow.fn if isinstance(workflow, FunctionWorkflow) else type(workflow)
    qualname = getattr(obj, "__qualname__", "")
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    if not qualname or "<locals>" in qualname or "<lambda>" in qualname or module is None:
        raise WorkflowLoadError(
            f"{qualname or obj!r} is not defined at module level, so the GPU backbones' workers cannot "
            "import it. Define the workflow at the top of a module, or set workflow.target in the config.")
    if module.__name__ == "__main__" or module.__name__.startswith("ajet_user_"):
        path = getattr(module, "__file__", None)
        if not path:
            raise WorkflowLoadError(
                f"{qualname} lives in an interactive session (no file); put it in a .py file or a module "
                "and pass that, or set workflow.target in the config.")
        return f"{Path(path).resolve()}:{qualname}"
    return f"{module.__name__}:{qualname}"


def trainable_targets_of(configured: list[str], workflow: Any) -> list[str] | None:
    """The roles a run trains: `workflow.trainable_targets` of the config, else the workflow
    class's own `trainable_targets`; None when neither names any (every role is trained)."""
    return list(configured) or list(getattr(workflow, "trainable_targets", None) or []) or None


def load_or_wrap_workflow(obj: WorkflowArg | None, target: str) -> Workflow:
    """The workflow a recipe runs: `obj` when given (from `ajet.tune(workflow=...)`), else the
    config's `workflow.target` loaded."""
    if obj is not None:
        return as_workflow(obj)
    return load_workflow(target)


def load_workflow(target: str) -> Workflow:
    """Load `package.module:ClassName` or `/path/to/file.py:ClassName` (class or async function)."""
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise WorkflowLoadError(f"workflow target '{target}' is not of the form {EXPECTED_TARGET}")
    if module_part.endswith(".py"):
        module = _import_file(Path(module_part), target)
    else:
        module = _import_module(module_part, target)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(module) if not n.startswith("_"))[:20]
            raise WorkflowLoadError(
                f"workflow target '{target}': '{module_part}' has no attribute '{attr}'. "
                f"Names it defines: {', '.join(public) or '(none)'}"
            )
        obj = getattr(obj, part)
    return as_workflow(obj, origin=f"workflow target '{target}'")


def _import_module(name: str, target: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # user code: re-raise with the target and the original error
        raise WorkflowLoadError(
            f"workflow target '{target}': importing module '{name}' failed: "
            f"{type(exc).__name__}: {exc}. Expected {EXPECTED_TARGET}; the module must be importable "
            "(installed, or on PYTHONPATH)"
        ) from exc


def _import_file(path: Path, target: str) -> Any:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise WorkflowLoadError(
            f"workflow target '{target}': file not found: {path}. Expected {EXPECTED_TARGET} "
            "(a relative path is relative to the YAML)"
        )
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"ajet_user_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkflowLoadError(
            f"workflow target '{target}': cannot load {path} as a Python module"
        )
    module = importlib.util.module_from_spec(spec)
    # The workflow's own directory goes on sys.path so it can import its sibling files.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module  # pydantic and pickling look classes up by module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # user code: re-raise with the target and the original error
        del sys.modules[module_name]
        raise WorkflowLoadError(
            f"workflow target '{target}': importing {path} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module
