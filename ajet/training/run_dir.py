"""The run directory `{project.exp_dir}/{project.name}` and its rules, for every recipe.

A new run refuses a directory that already holds an earlier run (checkpoints or logged
metrics): pass `--resume` to continue it, or choose another name. `--resume` means continue:
it refuses a run directory that does not exist. `config.yaml` records the resolved config
(written atomically: a kill never leaves half of it).
"""

from __future__ import annotations

from pathlib import Path

from ajet.config import to_yaml
from ajet.config.schema import AjetConfig
from ajet.errors import UserError
from ajet.files import write_text_atomic
from ajet.training.checkpoint_dir import cleanup_partial, latest_checkpoint


def run_dir_of(cfg: AjetConfig) -> Path:
    """Where a run writes its outputs."""
    return Path(cfg.project.exp_dir).expanduser() / cfg.project.name


def prepare_run_dir(cfg: AjetConfig, *, resume: bool, backbone_checkpoints: str = "") -> Path:
    """Check the resume rules, write config.yaml; return the run directory. `backbone_checkpoints`:
    a glob under the run directory where a GPU backbone keeps its own checkpoints (they count as
    an earlier run's, like ajet's `checkpoints/`)."""
    run_dir = run_dir_of(cfg)
    ckpt_root = run_dir / "checkpoints"
    cleanup_partial(ckpt_root)
    if resume and not run_dir.is_dir():
        raise UserError(
            f"--resume: {run_dir} does not exist, so there is no run to continue. Check project.name / "
            "--exp-dir, or drop --resume to start a new run.")
    metrics = run_dir / "metrics.jsonl"
    has_checkpoint = latest_checkpoint(ckpt_root) is not None or (
        bool(backbone_checkpoints) and any(p.is_dir() for p in run_dir.glob(backbone_checkpoints)))
    if not resume and (has_checkpoint or (metrics.is_file() and metrics.stat().st_size)):
        what = "checkpoints" if has_checkpoint else "metrics (metrics.jsonl)"
        raise UserError(
            f"{run_dir} already holds {what} of an earlier run. Pass --resume to continue it, "
            "or choose another project.name / --exp-dir.")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "config.yaml", to_yaml(cfg))
    return run_dir
