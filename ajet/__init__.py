"""ajet: train the language model behind an agent workflow.

Kept import-light: `import ajet` must not pull torch, ray or agentscope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask  # noqa: F401

_LAZY = {
    "Workflow": "ajet.workflow",
    "WorkflowTask": "ajet.workflow",
    "WorkflowOutput": "ajet.workflow",
    "tune": "ajet.tune",
    "ModelTuner": "ajet.tuner",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ajet' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(module), name)
