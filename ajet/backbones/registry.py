"""Backbone lookup. Each backbone module is imported only when chosen."""

from __future__ import annotations

import importlib
from typing import Protocol

from ajet.config import ConfigError
from ajet.config.choices import Backbone
from ajet.config.schema import AjetConfig


class BackboneRunner(Protocol):
    def check_config(self, cfg: AjetConfig) -> list[tuple[str, str]]:
        """Settings that would do nothing (or cannot work) on this backbone."""

    def translate(self, cfg: AjetConfig) -> str | None:
        """The backbone's own config as text (for --dry-run), or None."""

    def run(self, cfg: AjetConfig, *, with_ray: bool, resume: bool) -> None:
        """Train."""


def get_backbone(name: str) -> BackboneRunner:
    """The module `ajet.backbones.<name>`; the names are the `Backbone` choices."""
    if name not in Backbone.__members__:
        raise ValueError(f"unknown backbone '{name}'; choose one of {sorted(Backbone.__members__)}")
    return importlib.import_module(f"ajet.backbones.{name}")  # type: ignore[return-value]


def checked_backbone(name: str, cfg: AjetConfig, source: str) -> BackboneRunner:
    """The backbone, after its own config checks; raises ConfigError naming every problem."""
    runner = get_backbone(name)
    problems = runner.check_config(cfg)
    if problems:
        lines = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        raise ConfigError(f"invalid config for --backbone={name} ({source}):\n{lines}")
    return runner
