"""The debug backbone: inference engine and trainer in one process (CPU or one GPU)."""

from __future__ import annotations

from ajet.config.schema import AjetConfig


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    problems = []
    if cfg.ray.address and False:  # placeholder for backbone-specific checks
        problems.append(("ray.address", ""))
    return problems


def translate(cfg: AjetConfig) -> str | None:
    return None


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool) -> None:
    from ajet.backbones.debug.trainer import train

    train(cfg, with_ray=with_ray, resume=resume)
