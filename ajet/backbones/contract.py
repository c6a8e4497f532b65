"""What a backbone is: the `Backbone` protocol every backbone module implements (mypy checks each
against it, `ajet.backbones.registry`), and its `Capabilities` as data.

A run's config is held against the chosen backbone's capabilities (`capability_problems`): a
setting it cannot honour is refused by name, with the fix and the backbones that can. A
backbone's own `check_config` adds what no capability expresses (its own sections' values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ajet.algorithms.base import Problems, Recipe
from ajet.algorithms.registry import get_algorithm, names

if TYPE_CHECKING:
    from ajet.config.schema import AjetConfig
    from ajet.rollout.workflow_loader import WorkflowArg


@dataclass(frozen=True)
class Capabilities:
    """What a backbone can do; a run that needs more is refused before it starts."""

    algorithms: tuple[str, ...] | None  # `algorithm.name`s it trains; None: every registered one
    stages: bool  # runs `pipeline.stages`, one stage after the other
    overlap: bool  # rolls out the next step during the update (`rollout.max_staleness` > 0)
    serve: bool  # trains on episodes that clients drive over HTTP (`ajet serve`)
    ray_recipes: tuple[Recipe, ...]  # the recipes that `--with-ray` can run
    per_role_adapters: bool  # one LoRA adapter per role (`model.lora.per_role`)
    group_judges: bool  # judges that score a task's episodes together (`judge.type: group_rank`)
    curriculum: bool  # the task reader's curriculum (`task_reader.curriculum.key`)
    task_selection: bool  # passing over settled tasks (`task_reader.selection`)
    generated_tasks: bool  # tasks the local model writes (`task_reader.type: generate`)
    cpu: bool  # trains on a CPU (`model.device: cpu`)
    # Keeps the matmul outputs inside a checkpointed layer (`trainer.checkpoint_keep_matmuls`): the
    # backbone's trainer is ajet's own (`ajet.training.model.KeepMatmuls`).
    keep_matmuls: bool
    # Loads `model.path` itself (here or on its GPU workers); False: the model is a service's, and
    # a run does not convert the bundled model for it (`ajet.cli.convert_model`).
    local_model: bool = True
    # Its own config section (`trinity`, `verl`), or "": another backbone's section set away from
    # its defaults has no effect here and is refused.
    section: str = ""


class Backbone(Protocol):
    """A backbone module (`ajet.backbones.<name>`)."""

    CAPABILITIES: Capabilities

    def check_config(self, cfg: AjetConfig) -> Problems:
        """Its own settings that cannot work (beyond what the capabilities say)."""
        ...

    def translate(self, cfg: AjetConfig, *, resume: bool = False) -> str | None:
        """Its own config as text (what --dry-run prints), or None when it has none."""
        ...

    def run(self, cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: WorkflowArg | None = None,
            ) -> Path | None:
        """Train `cfg` (one stage: `ajet.pipeline` runs the stages of a backbone with `stages`); the run
        directory when it trains in this process."""
        ...


@dataclass(frozen=True)
class Need:
    """A capability a config may need: whether it does, and how to say what and how to do without."""

    capability: str  # a `Capabilities` field
    key: str  # the setting that needs it
    needs: Callable[[AjetConfig], bool]
    what: str  # what the setting asks for, after its key
    fix: str  # how to run without it


NEEDS = (
    Need("stages", "pipeline.stages", lambda cfg: bool(cfg.pipeline.stages),
         " (several stages in one run)", "run each stage on its own (algorithm.name=<stage>, model.path= the "
         "previous stage's final_model)"),
    Need("overlap", "rollout.max_staleness", lambda cfg: cfg.rollout.max_staleness > 0,
         " (rollout overlapped with the update)", "it schedules its own rollouts: set it to 0"),
    Need("per_role_adapters", "model.lora.per_role", lambda cfg: cfg.model.lora.per_role,
         " (one LoRA adapter per role, served in mixed batches)", "it trains one model: set it to false"),
    Need("group_judges", "judge.type", lambda cfg: cfg.judge.type == "group_rank",
         "=group_rank (a judge that scores a group's episodes together)", "it runs each episode on its own (its worker sees "
         "no group): use a per-episode judge (e.g. judge.type=llm)"),
    Need("curriculum", "task_reader.curriculum.key", lambda cfg: bool(cfg.task_reader.curriculum.key),
         " (the task reader's curriculum)", "it reads the train tasks in its own order: set it to '' (off)"),
    Need("task_selection", "task_reader.selection.enabled", lambda cfg: cfg.task_reader.selection.enabled,
         " (passing over the tasks the policy always or never solves)", "it reads the train tasks in its own "
         "order: set it to false"),
    Need("generated_tasks", "task_reader.type", lambda cfg: cfg.task_reader.type.value == "generate",
         "=generate (tasks the local model writes)", "generate them with --backbone=debug first, then "
         "point task_reader.jsonl at the result"),
    Need("keep_matmuls", "trainer.checkpoint_keep_matmuls", lambda cfg: cfg.trainer.checkpoint_keep_matmuls,
         "=true (matmul outputs kept through activation checkpointing)", "its trainer checkpoints whole layers "
         "(trainer.gradient_checkpointing): set it to false"),
    Need("cpu", "model.device", lambda cfg: cfg.model.device == "cpu",
         "=cpu (training on a CPU)", "it trains on GPUs: remove it"),
)


def capability_problems(cfg: AjetConfig, name: str, capabilities: dict[str, Capabilities]) -> Problems:
    """What `cfg` needs that backbone `name` cannot do; `capabilities` holds every backbone's, so
    each message says which backbones can."""
    own = capabilities[name]
    problems: Problems = []
    for need in NEEDS:
        if need.needs(cfg) and not getattr(own, need.capability):
            able = [other for other, caps in capabilities.items() if getattr(caps, need.capability)]
            problems.append((need.key, f"{need.what} runs on --backbone={' or '.join(able) or '(none)'} only; "
                                       f"on {name} {need.fix}"))
    spec = get_algorithm(cfg.algorithm.name)
    trained = names() if own.algorithms is None else list(own.algorithms)
    if spec.name not in trained:
        problems.append(("algorithm.name", f"={spec.name} does not run on --backbone={name}: {spec.elsewhere} "
                                           f"(the {name} backbone trains {', '.join(trained)})"))
    for other, caps in capabilities.items():
        if other != name and caps.section:
            problems += [(key, f"is a {other} setting and has no effect on --backbone={name}; remove it or use "
                               f"--backbone={other}") for key in changed_keys(cfg, caps.section)]
    return problems


def ray_problem(name: str, capabilities: Capabilities, recipe: Recipe, staged: bool) -> str | None:
    """Why `--with-ray` cannot run this on backbone `name`, or None."""
    if staged or recipe not in capabilities.ray_recipes:
        what = "staged runs" if staged else f"the {recipe} recipe"
        return f"--with-ray is not implemented for {what} on --backbone={name}; run without it."
    return None


def changed_keys(cfg: AjetConfig, section: str) -> list[str]:
    """Dotted keys of config section `section` whose values differ from its defaults."""
    current = getattr(cfg, section)
    default = type(current)()
    return [f"{section}.{key}" for key in vars(default) if getattr(current, key) != getattr(default, key)]
