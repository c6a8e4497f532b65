"""verl backbone (GPU clusters)."""

from __future__ import annotations

from ajet.backbones.gpu import require_gpus
from ajet.config.schema import AjetConfig


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    return []


def translate(cfg: AjetConfig) -> str | None:
    return None


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool) -> None:
    require_gpus("verl", "verl", "verl")
    from ajet.cli.common import UserError

    raise UserError("the verl backbone adapter is not implemented yet (see issue 8).")
