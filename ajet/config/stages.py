"""Stage-aware config: which stages a run executes, and their checks.

A run executes `pipeline.stages`, or the one `algorithm.name`. Each stage runs with the run's
config plus `pipeline.overrides[<stage>]`. Pure config work, nothing heavy is imported: it runs
at load time (`ajet.config.validate`); `ajet.pipeline` builds each stage's config from it.
"""

from __future__ import annotations

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ajet.algorithms.registry import EVAL_STAGE, get_algorithm, names
from ajet.algorithms.registry import stage_names as known_stages
from ajet.config.ranges import range_problems
from ajet.config.schema import AjetConfig


def stage_names(cfg: AjetConfig) -> list[str]:
    """The stages a run executes: `pipeline.stages`, or the one `algorithm.name`."""
    return [str(s) for s in cfg.pipeline.stages] or [cfg.algorithm.name]


def name_problems(cfg: AjetConfig) -> list[tuple[str, str]]:
    """`algorithm.name` and `pipeline.stages` against the registry's names."""
    problems: list[tuple[str, str]] = []
    algorithms = names()
    if cfg.algorithm.name not in algorithms:  # worded as the loader words an enum's bad value
        problems.append(("algorithm.name", f"Invalid value '{cfg.algorithm.name}', expected one of "
                                           f"[{', '.join(algorithms)}]"))
    for index, stage in enumerate(cfg.pipeline.stages):
        if stage not in known_stages():
            problems.append((f"pipeline.stages[{index}]", f"Invalid value '{stage}', expected one of "
                                                          f"[{', '.join(known_stages())}]"))
    return problems


def needs_workflow(cfg: AjetConfig) -> bool:
    """Every stage but SFT runs the workflow (rollouts or evaluation)."""
    return any(stage != "sft" for stage in stage_names(cfg))


def stage_problems(cfg: AjetConfig) -> list[tuple[str, str]]:
    """Config problems of the stages the run executes, as (dotted key, what would be valid)."""
    problems: list[tuple[str, str]] = []
    stages = stage_names(cfg)
    base_ranges = set(range_problems(cfg))  # reported by `validate` itself
    overrides = stage_overrides(cfg)
    for name, override in overrides.items():
        if name not in stages:
            problems.append((f"pipeline.overrides.{name}", f"no stage named '{name}' in {stages} "
                             f"(drop it from the command line with pipeline.overrides.{name}=null)"))
            continue
        try:
            stage_cfg = apply_override(cfg, override)
        except ValueError as exc:
            problems.append((f"pipeline.overrides.{name}", str(exc)))
            continue
        where = f"pipeline.overrides.{name} -> "
        problems += [(key, where + msg) for key, msg in range_problems(stage_cfg) if (key, msg) not in base_ranges]
        problems += _checks(stage_cfg, name, prefix=where)
    for name in dict.fromkeys(stages):
        if name not in overrides:
            problems += _checks(cfg, name, prefix="")
    return problems


def stage_overrides(cfg: AjetConfig) -> dict[str, object]:
    """`pipeline.overrides` without the stages set to null (`pipeline.overrides.sft=null` on the
    command line drops a YAML's override, e.g. when `pipeline.stages` leaves that stage out)."""
    return {name: override for name, override in cfg.pipeline.overrides.items() if override is not None}


def apply_override(cfg: AjetConfig, override: object) -> AjetConfig:
    """`cfg` with a nested mapping merged over it (ValueError naming the bad key)."""
    if not isinstance(override, dict):
        raise ValueError(f"must be a mapping of config sections, got {type(override).__name__}")
    if "pipeline" in override:
        raise ValueError("a stage cannot change the pipeline itself")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cfg), OmegaConf.create(override))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ValueError(f"{key}: {str(exc).strip().splitlines()[0]}") from None
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def _checks(cfg: AjetConfig, stage: str, prefix: str) -> list[tuple[str, str]]:
    """The stage's algorithm's own checks (`AlgorithmSpec.config_problems`)."""
    out: list[tuple[str, str]] = []
    if stage in known_stages() and stage != EVAL_STAGE:
        checks = get_algorithm(stage).config_problems
        out += [(key, prefix + msg) for key, msg in (checks(cfg) if checks is not None else [])]
    return out
