"""Checks of the GPU backbones (trinity, verl) that are not capabilities: GPUs and packages on
this machine, and what their FSDP trainers do not offer. No torch / ray / trinity / verl import
at module level."""

from __future__ import annotations

import importlib.util

from ajet.algorithms.base import Problems
from ajet.config.schema import AjetConfig
from ajet.errors import SetupError
from ajet.gpus import visible_gpus


def require_gpus(backbone: str, extra: str, module: str) -> None:
    """Fail with a clear message when the backbone cannot run on this machine."""
    if not visible_gpus():
        raise SetupError(
            f"--backbone={backbone} needs NVIDIA GPUs and none is visible on this machine.\n"
            f"  To train here (CPU or one GPU), use --backbone=debug.\n"
            f"  To inspect the translated {backbone} config, add --dry-run."
        )
    missing = [m for m in (module, "vllm") if importlib.util.find_spec(m) is None]
    if missing:
        raise SetupError(
            f"--backbone={backbone} needs the {' and '.join(repr(m) for m in missing)} package"
            f"{'s' if len(missing) > 1 else ''}: pip install 'ajet[{extra}-gpu]' "
            f"(in its own environment: make env-{extra} GPU=1)."
        )


def fsdp_problems(cfg: AjetConfig, backbone: str) -> Problems:
    """Settings the GPU backbones' FSDP trainers have no equivalent of (pure)."""
    problems: Problems = []
    if cfg.trainer.lr_schedule == "linear":
        problems.append(("trainer.lr_schedule", f"=linear is not offered by {backbone}'s FSDP "
                                                "optimizer; use constant or cosine"))
    if cfg.model.lora.enabled and cfg.model.lora.dropout:
        problems.append(("model.lora.dropout", f"has no {backbone} equivalent; set it to 0"))
    return problems
