"""The algorithms ajet trains: one entry per algorithm file. Everything that names algorithms
(`algorithm.name`'s choices, the pipeline's stages, the config's checks, the recipes, the GPU
backbones' translations) reads it here.

Adding an algorithm: write `ajet/algorithms/<name>.py` with its estimator, loss and `SPEC`
(`ajet.algorithms.base.AlgorithmSpec`), and add its `SPEC` to `BUILTIN` below (or, from your
own code, call `register(SPEC)` before the config loads).
"""

from __future__ import annotations

from ajet.algorithms import distill, dpo, grpo, ppo, reinforce_pp, rloo, sft
from ajet.algorithms.base import AlgorithmSpec, Recipe

# In the order of a pipeline that uses them all (a warm-up, then RL).
BUILTIN: tuple[AlgorithmSpec, ...] = (sft.SPEC, dpo.SPEC, grpo.SPEC, rloo.SPEC, reinforce_pp.SPEC, ppo.SPEC,
                                      distill.SPEC)
_ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for spec in BUILTIN}
# A pipeline stage is an algorithm's name, or this: an evaluation of the model so far.
EVAL_STAGE = "eval"


def register(spec: AlgorithmSpec) -> None:
    """Add `spec` (a name already taken is refused: unregister it first)."""
    if spec.name in _ALGORITHMS or spec.name == EVAL_STAGE:
        raise ValueError(f"an algorithm named {spec.name!r} is already registered")
    if not spec.name.isidentifier():
        raise ValueError(f"algorithm name {spec.name!r} must be an identifier (letters, digits, _)")
    _ALGORITHMS[spec.name] = spec


def unregister(name: str) -> None:
    """Remove a registered algorithm (a test's toy; the built-in ones stay)."""
    if any(spec.name == name for spec in BUILTIN):
        raise ValueError(f"{name!r} is built in")
    _ALGORITHMS.pop(name, None)


def get_algorithm(name: str) -> AlgorithmSpec:
    """The spec of `algorithm.name`; a ValueError naming the choices for an unknown one."""
    try:
        return _ALGORITHMS[str(name)]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {names()}") from None


def names(*, recipe: Recipe | None = None) -> list[str]:
    """The algorithms' names (of one recipe), in registry order."""
    return [name for name, spec in _ALGORITHMS.items() if recipe is None or spec.recipe == recipe]


def stage_names() -> list[str]:
    """What `pipeline.stages` may list: every algorithm, and `eval`."""
    return [*names(), EVAL_STAGE]


def backbone_algorithms(backbone: str) -> list[str]:
    """The algorithms a remote backbone trains: those its `AlgorithmSpec.backbone_names` entry names."""
    return [name for name, spec in _ALGORITHMS.items() if backbone in spec.backbone_names]


def markdown_table() -> str:
    """The algorithms as docs/algorithms.md's table (a test keeps the two identical)."""
    rows = ["| `algorithm.name` | what it is | recipe | groups (rollout.n >= 2) | loss terms | step credit | trinity | verl | tinker |",
            "|---|---|---|---|---|---|---|---|---|"]
    for spec in _ALGORITHMS.values():
        rows.append(f"| `{spec.name}` | {spec.summary} | {spec.recipe} | {'yes' if spec.needs_groups else 'no'} | "
                    f"{', '.join(spec.loss_terms) or '(its recipe)'} | {', '.join(spec.step_credit) or '-'} | "
                    f"{_backbone_cell(spec, 'trinity')} | {_backbone_cell(spec, 'verl')} | {_backbone_cell(spec, 'tinker')} |")
    return "\n".join(rows) + "\n"


def _backbone_cell(spec: AlgorithmSpec, backbone: str) -> str:
    return f"`{spec.backbone_names[backbone]}`" if backbone in spec.backbone_names else "no"
