"""Trinity-RFT backbone (GPU clusters): our config translated to Trinity's, our episode
runner as a Trinity workflow plugin (`ajet.backbones.trinity.workflow`)."""

from __future__ import annotations

import logging
from typing import Any

# Imported first on purpose: loading the submodule `translate` sets the package attribute
# `translate`; the function below must be defined after it to stay what the CLI calls.
from ajet.backbones.trinity import translate as translation  # noqa: F401
from ajet.config.schema import AjetConfig

log = logging.getLogger(__name__)


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    from ajet.backbones.trinity.translate import check_config as check

    return check(cfg)


def translate(cfg: AjetConfig, *, resume: bool = False) -> str:
    """The Trinity config YAML this run would use (what --dry-run prints)."""
    from ajet.backbones.gpu import dump_yaml, model_path_for
    from ajet.backbones.trinity.translate import TRINITY_VERSION, to_trinity_config

    model_path, found = model_path_for(cfg)
    header = f"# Trinity-RFT config (key names of trinity-rft {TRINITY_VERSION})\n"
    if not found:
        header += f"# model.path={model_path} is not on this machine; used as given\n"
    return header + dump_yaml(to_trinity_config(cfg, model_path=model_path, resume=resume))


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: Any = None) -> None:
    """Export the tasks, write Trinity's config, and run Trinity (needs GPUs)."""
    from ajet.backbones.gpu import require_gpus, with_workflow

    require_gpus("trinity", "trinity", "trinity")
    from ajet.backbones.trinity.driver import run_trinity

    run_trinity(with_workflow(cfg, workflow), resume=resume)
