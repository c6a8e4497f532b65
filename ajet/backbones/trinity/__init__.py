"""Trinity-RFT backbone (GPU clusters): our config translated to Trinity's, our episode
runner as a Trinity workflow plugin (`ajet.backbones.trinity.workflow`)."""

from __future__ import annotations

import logging
from pathlib import Path

from ajet.algorithms.base import Problems
from ajet.algorithms.registry import backbone_algorithms
from ajet.backbones.contract import Capabilities
from ajet.backbones.gpu_checks import require_gpus
from ajet.backbones.gpu_config import dump_yaml, model_path_for, with_workflow
from ajet.backbones.trinity import translation
from ajet.backbones.trinity.driver import run_trinity
from ajet.config.schema import AjetConfig
from ajet.rollout.workflow_loader import WorkflowArg

log = logging.getLogger(__name__)


CAPABILITIES = Capabilities(
    algorithms=tuple(backbone_algorithms("trinity")), stages=False, overlap=False, serve=False, ray_recipes=("rl",),
    per_role_adapters=False, group_judges=False, curriculum=False, task_selection=False, generated_tasks=False, cpu=False, keep_matmuls=False,
    section="trinity",
)


def check_config(cfg: AjetConfig) -> Problems:
    return translation.check_config(cfg)


def translate(cfg: AjetConfig, *, resume: bool = False) -> str:
    """The Trinity config YAML this run would use (what --dry-run prints)."""
    model_path, found = model_path_for(cfg)
    header = f"# Trinity-RFT config (key names of trinity-rft {translation.TRINITY_VERSION})\n"
    if not found:
        header += f"# model.path={model_path} is not on this machine; used as given\n"
    return header + dump_yaml(translation.to_trinity_config(cfg, model_path=model_path, resume=resume))


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: WorkflowArg | None = None) -> Path | None:
    """Export the tasks, write Trinity's config, and run Trinity (needs GPUs)."""
    require_gpus("trinity", "trinity", "trinity")
    run_trinity(with_workflow(cfg, workflow), resume=resume)
    return None  # its outputs are Trinity's, under the run directory
