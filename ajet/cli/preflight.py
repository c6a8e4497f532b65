"""What `--dry-run` checks beyond the config itself, so that a dry run that passes means
the run starts: the workflow imports (its module, its class or function) and, with
`model.lora.per_role`, names trainable roles to give adapters to; a custom judge imports, and
`model.path` resolves. Nothing heavy is loaded: no model, no engine, no data.
"""

from __future__ import annotations

from ajet.config.schema import AjetConfig
from ajet.config.stages import needs_workflow
from ajet.judge.build import BUILTINS, load_target
from ajet.models.resolve import check_model_path
from ajet.rollout.loader import load_workflow, trainable_targets_of
from ajet.training.model import per_role_adapters


def preflight(cfg: AjetConfig) -> list[str]:
    """What the run would load first, checked; returns one line per check that passed.

    Raises the same user error the real run would (workflow, judge or model not found).
    """
    done = []
    if cfg.workflow.target and needs_workflow(cfg):
        workflow = load_workflow(cfg.workflow.target)
        done.append(f"workflow {cfg.workflow.target} loads ({type(workflow).__name__})")
        if cfg.model.lora.enabled and cfg.model.lora.per_role:
            roles = per_role_adapters(cfg.model.lora, trainable_targets_of(cfg.workflow.trainable_targets, workflow))
            done.append(f"model.lora.per_role: one adapter for each of {', '.join(roles)}")
    if cfg.judge.type != "none" and cfg.judge.type not in BUILTINS:
        load_target(cfg.judge.type)
        done.append(f"judge {cfg.judge.type} imports")
    check_model_path(cfg.model.path, cfg.model.cache_dir)
    done.append(f"model.path {cfg.model.path} found")
    return done
