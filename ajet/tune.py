"""`ajet.tune(workflow, "conf.yaml")`: train from Python instead of the CLI.

```python
import ajet

async def solve(task: dict, model) -> float:
    reply = await model(messages=[{"role": "user", "content": task["main_query"]}])
    ...
    return 1.0 if correct else 0.0

ajet.tune(solve, "math.yaml")
```

The workflow is checked first (a function's signature, a class's `execute`), so a mistake
fails in milliseconds, before the config's heavy parts or any model load.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ajet.backbones.registry import checked_backbone
from ajet.config import load_config
from ajet.outputs.setup import configure_logging
from ajet.rollout.workflow_loader import as_workflow
from ajet.workflow import Workflow

logger = logging.getLogger(__name__)


def tune(
    workflow: Callable[..., Any] | type[Workflow] | Workflow,
    config_path: str | Path,
    *,
    backbone: str = "debug",
    overrides: Sequence[str] = (),
    with_ray: bool = False,
    resume: bool = False,
) -> None:
    """Train the model behind `workflow` with the run described by `config_path`.

    `workflow`: a `Workflow` subclass or instance, or `async def fn(task: dict, model) -> float`.
    `overrides`: dotted `KEY=VALUE` settings, as on the command line.
    Raises `WorkflowSignatureError` / `WorkflowLoadError` for a bad workflow and
    `ajet.config.ConfigError` for a bad config, before anything heavy starts.
    """
    wf = as_workflow(workflow)  # pure checks: nothing heavy imported yet
    cfg = load_config(config_path, list(overrides), require_workflow=False)
    if cfg.workflow.target:
        logger.info(
            "ajet.tune: using the workflow passed in, not workflow.target=%s", cfg.workflow.target
        )
    runner = checked_backbone(backbone, cfg, str(config_path), with_ray=with_ray)
    if not logging.getLogger().handlers:  # a script, not an app with its own logging setup
        configure_logging(cfg.logging.level, quiet=cfg.logging.quiet)
    from ajet.pipeline import run  # imports torch: ajet.tune stays light until a run starts

    run(cfg, runner, backbone=backbone, with_ray=with_ray, resume=resume, workflow=wf)


class _CallableModule(types.ModuleType):
    """`ajet.tune` names both this module and the function: once `import ajet.tune` has run,
    the attribute `ajet.tune` is the module (the import system sets it), so the module itself
    forwards calls to `tune` and `ajet.tune(fn, "conf.yaml")` works either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
