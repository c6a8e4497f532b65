"""Shared checks for the GPU backbones."""

from __future__ import annotations

from ajet.cli.common import UserError


def require_gpus(backbone: str, extra: str, module: str) -> None:
    """Fail with a clear message when the backbone cannot run on this machine."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        raise UserError(
            f"--backbone={backbone} needs NVIDIA GPUs and none is visible on this machine.\n"
            f"  To train here (CPU or one GPU), use --backbone=debug.\n"
            f"  To inspect the translated {backbone} config, add --dry-run."
        )
    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"--backbone={backbone} needs the '{module}' package: pip install 'ajet[{extra}]' "
            f"(in its own environment: make env-{extra})."
        )
