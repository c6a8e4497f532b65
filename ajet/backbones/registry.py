"""Backbone lookup, and the checks of a run against the chosen backbone's capabilities. Each
backbone module is imported only when asked for (its heavy parts only when it runs)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from ajet.algorithms.base import Problems
from ajet.algorithms.registry import get_algorithm
from ajet.backbones.contract import Backbone, Capabilities, capability_problems, ray_problem
from ajet.config import ConfigError
from ajet.config.choices import Backbone as BackboneName
from ajet.config.schema import AjetConfig

if TYPE_CHECKING:  # mypy holds every backbone module against the contract
    from ajet.backbones import debug, tinker, trinity, verl

    _CONTRACT: tuple[Backbone, ...] = (debug, trinity, verl, tinker)


def get_backbone(name: str) -> Backbone:
    """The module `ajet.backbones.<name>`: the backbone a run uses; the names are the `Backbone` choices."""
    if name not in BackboneName.__members__:
        raise ValueError(f"unknown backbone '{name}'; choose one of {sorted(BackboneName.__members__)}")
    return _module(name)


def all_capabilities() -> dict[str, Capabilities]:
    """Every backbone's capabilities, by name (what a refusal says can do it instead)."""
    return {name: _module(name).CAPABILITIES for name in BackboneName.__members__}


def _module(name: str) -> Backbone:
    return cast(Backbone, importlib.import_module(f"ajet.backbones.{name}"))


def backbone_problems(name: str, cfg: AjetConfig, *, with_ray: bool = False) -> Problems:
    """What backbone `name` cannot do of `cfg`: its capabilities, then its own checks."""
    return _problems(name, get_backbone(name), cfg, with_ray)


def _problems(name: str, backbone: Backbone, cfg: AjetConfig, with_ray: bool) -> Problems:
    problems = capability_problems(cfg, name, {**all_capabilities(), name: backbone.CAPABILITIES})
    if with_ray and (problem := ray_problem(name, backbone.CAPABILITIES, get_algorithm(cfg.algorithm.name).recipe,
                                            staged=bool(cfg.pipeline.stages))):
        problems.append(("--with-ray", problem))
    return problems + backbone.check_config(cfg)


def checked_backbone(name: str, cfg: AjetConfig, source: str, *, with_ray: bool = False) -> Backbone:
    """The backbone, after the checks of `cfg` against it; raises ConfigError naming every problem."""
    backbone = get_backbone(name)
    problems = _problems(name, backbone, cfg, with_ray)
    if problems:
        lines = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        raise ConfigError(f"invalid config for --backbone={name} ({source}):\n{lines}")
    return backbone


def capabilities_table() -> str:
    """Every backbone's capabilities as docs/backbones.md's table (a test keeps the two identical)."""
    caps = all_capabilities()
    fields = ("algorithms", "stages", "overlap", "serve", "per_role_adapters", "group_judges", "curriculum",
              "task_selection", "generated_tasks", "cpu", "keep_matmuls", "ray_recipes")
    lines = ["| capability | " + " | ".join(f"`{name}`" for name in caps) + " |",
             "|---|" + "---|" * len(caps)]
    lines += [f"| `{field}` | " + " | ".join(_cell(getattr(c, field)) for c in caps.values()) + " |"
              for field in fields]
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    if value is None:
        return "all"
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return "yes" if value else "no"
