"""ajet/errors.py holds every `AjetError` (its docstring says which exceptions stay elsewhere)."""

from __future__ import annotations

import ast
from pathlib import Path

import ajet.errors as errors

AJET = Path(errors.__file__).parent
HIERARCHY = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, errors.AjetError)}


def test_every_ajet_error_is_defined_in_errors_py() -> None:
    stray = []
    for path in sorted(AJET.rglob("*.py")):
        if path == Path(errors.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                if bases & HIERARCHY:
                    stray.append(f"{path.relative_to(AJET.parent)}:{node.lineno} {node.name}")
    assert stray == [], "define these in ajet/errors.py (and import them back where they are raised)"


def test_moved_errors_are_still_importable_where_they_are_raised() -> None:
    from ajet.eval.runner import EvalError
    from ajet.rollout.workflow_loader import WorkflowSignatureError
    from ajet.task_reader.env_client import EnvServiceError

    assert EvalError is errors.EvalError and issubclass(WorkflowSignatureError, errors.UserError)
    assert issubclass(EnvServiceError, errors.TaskReaderError) and EnvServiceError("x", 503).status_code == 503
