"""verl backbone (GPU clusters): our config translated to verl's Hydra overrides, our episode
runner as a verl agent loop (`ajet.backbones.verl.agent_loop`)."""

from __future__ import annotations

from typing import Any

from ajet.backbones.gpu_shared import dump_yaml, model_path_for, require_gpus, with_workflow
from ajet.backbones.verl import translation
from ajet.backbones.verl.driver import run_verl
from ajet.config.schema import AjetConfig


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    return translation.check_config(cfg)


def translate(cfg: AjetConfig, *, resume: bool = False) -> str:
    """The verl overrides this run would use, as YAML (what --dry-run prints)."""
    model_path, found = model_path_for(cfg)
    header = (f"# verl overrides of ppo_trainer (key names of verl {translation.VERL_VERSION}); "
              "passed as key=value to python -m verl.trainer.main_ppo\n")
    if not found:
        header += f"# model.path={model_path} is not on this machine; used as given\n"
    return header + dump_yaml(translation.to_verl_config(cfg, model_path=model_path, resume=resume))


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: Any = None) -> None:
    """Export the tasks, write verl's overrides, and run verl's trainer (needs GPUs)."""
    require_gpus("verl", "verl", "verl")
    run_verl(with_workflow(cfg, workflow), resume=resume)
