"""Trinity-RFT backbone (GPU clusters): our config translated to Trinity's, our episode
runner as a Trinity workflow plugin (`ajet.backbones.trinity.workflow`)."""

from __future__ import annotations

import logging
from typing import Any

from ajet.backbones.gpu_shared import dump_yaml, model_path_for, require_gpus, with_workflow
from ajet.backbones.trinity import translation
from ajet.backbones.trinity.driver import run_trinity
from ajet.config.schema import AjetConfig

log = logging.getLogger(__name__)


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    return translation.check_config(cfg)


def translate(cfg: AjetConfig, *, resume: bool = False) -> str:
    """The Trinity config YAML this run would use (what --dry-run prints)."""
    model_path, found = model_path_for(cfg)
    header = f"# Trinity-RFT config (key names of trinity-rft {translation.TRINITY_VERSION})\n"
    if not found:
        header += f"# model.path={model_path} is not on this machine; used as given\n"
    return header + dump_yaml(translation.to_trinity_config(cfg, model_path=model_path, resume=resume))


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: Any = None) -> None:
    """Export the tasks, write Trinity's config, and run Trinity (needs GPUs)."""
    require_gpus("trinity", "trinity", "trinity")
    run_trinity(with_workflow(cfg, workflow), resume=resume)
