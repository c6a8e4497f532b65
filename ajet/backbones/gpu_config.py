"""Pieces the GPU backbones' translations and drivers share to write their own config (pure, no
torch / ray / trinity / verl import at module level)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ajet.config.schema import AjetConfig
from ajet.models.resolve import ModelNotFoundError, resolve_model_path
from ajet.rollout.workflow_loader import WorkflowArg, as_workflow, target_of
from ajet.training.run_dir import run_dir_of

log = logging.getLogger(__name__)


def with_workflow(cfg: AjetConfig, workflow: WorkflowArg | None) -> AjetConfig:
    """`cfg` whose `workflow.target` names `workflow` (from `ajet.tune`), so the backbone's
    workers can import it; unchanged when no workflow object was passed."""
    if workflow is None:
        return cfg
    target = target_of(as_workflow(workflow))
    return dataclasses.replace(cfg, workflow=dataclasses.replace(cfg.workflow, target=target))


def run_dir(cfg: AjetConfig) -> Path:
    """The run directory (absolute): every output of the run goes under it."""
    return run_dir_of(cfg).resolve()


def model_path_for(cfg: AjetConfig) -> tuple[str, bool]:
    """(local checkpoint path, found): the resolved model directory, or the configured
    string when it cannot be resolved on this machine (dry-run on a laptop)."""
    try:
        return str(resolve_model_path(cfg.model.path, cfg.model.cache_dir)), True
    except ModelNotFoundError as exc:
        log.debug("model.path not resolved here: %s", exc)
        return cfg.model.path, False


def lora_target_regex(modules: list[str]) -> str:
    """A module-name regex for a list of module names (trinity takes one string) (pure)."""
    if not modules:
        return "all-linear"
    if len(modules) == 1 and modules[0] == "all-linear":
        return "all-linear"
    return r".*\.(" + "|".join(sorted(set(modules))) + ")"


def dump_yaml(data: Any) -> str:
    """YAML text of plain data (dicts keep their insertion order)."""
    import yaml

    class NoAliases(yaml.SafeDumper):  # repeated sub-dicts are written out, not as &anchors
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump(data, Dumper=NoAliases, sort_keys=False, default_flow_style=False, allow_unicode=True)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and empty dicts stay leaves (pure)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out
