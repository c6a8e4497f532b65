"""verl backbone (GPU clusters): our config translated to verl's Hydra overrides, our episode
runner as a verl agent loop (`ajet.backbones.verl.agent_loop`)."""

from __future__ import annotations

from typing import Any

# Imported first on purpose: loading the submodule `translate` sets the package attribute
# `translate`; the function below must be defined after it to stay what the CLI calls.
from ajet.backbones.verl import translate as translation  # noqa: F401
from ajet.config.schema import AjetConfig


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    from ajet.backbones.verl.translate import check_config as check

    return check(cfg)


def translate(cfg: AjetConfig, *, resume: bool = False) -> str:
    """The verl overrides this run would use, as YAML (what --dry-run prints)."""
    from ajet.backbones.gpu import dump_yaml, model_path_for
    from ajet.backbones.verl.translate import VERL_VERSION, to_verl_config

    model_path, found = model_path_for(cfg)
    header = (f"# verl overrides of ppo_trainer (key names of verl {VERL_VERSION}); "
              "passed as key=value to python -m verl.trainer.main_ppo\n")
    if not found:
        header += f"# model.path={model_path} is not on this machine; used as given\n"
    return header + dump_yaml(to_verl_config(cfg, model_path=model_path, resume=resume))


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: Any = None) -> None:
    """Export the tasks, write verl's overrides, and run verl's trainer (needs GPUs)."""
    from ajet.backbones.gpu import require_gpus, with_workflow

    require_gpus("verl", "verl", "verl")
    from ajet.backbones.verl.driver import run_verl

    run_verl(with_workflow(cfg, workflow), resume=resume)
