"""Backbone lookup. Each backbone module is imported only when chosen."""

from __future__ import annotations

import importlib
from typing import Protocol

from ajet.config.schema import AjetConfig

_MODULES = {
    "debug": "ajet.backbones.debug",
    "trinity": "ajet.backbones.trinity",
    "verl": "ajet.backbones.verl",
}


class BackboneRunner(Protocol):
    def check_config(self, cfg: AjetConfig) -> list[tuple[str, str]]:
        """Settings that would do nothing (or cannot work) on this backbone."""

    def translate(self, cfg: AjetConfig) -> str | None:
        """The backbone's own config as text (for --dry-run), or None."""

    def run(self, cfg: AjetConfig, *, with_ray: bool, resume: bool) -> None:
        """Train."""


def get_backbone(name: str) -> BackboneRunner:
    if name not in _MODULES:
        raise ValueError(f"unknown backbone '{name}'; choose one of {sorted(_MODULES)}")
    return importlib.import_module(_MODULES[name])  # type: ignore[return-value]


def checked_backbone(name: str, cfg: AjetConfig, source: str) -> BackboneRunner:
    """The backbone, after its own config checks; raises ConfigError naming every problem."""
    from ajet.config import ConfigError

    runner = get_backbone(name)
    problems = runner.check_config(cfg)
    if problems:
        lines = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        raise ConfigError(f"invalid config for --backbone={name} ({source}):\n{lines}")
    return runner
