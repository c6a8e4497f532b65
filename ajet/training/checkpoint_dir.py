"""The checkpoints directory without torch: which checkpoints are complete, which is newest.

`prepare_run_dir` checks these on the `--dry-run` path of the GPU backbones, which must not
import torch; writing and loading a checkpoint (torch) is `ajet.training.checkpoint`.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ajet.errors import RunDataError

# A checkpoint directory is complete once this marker is in it (written last).
_COMPLETE = ".complete"
# What to do when the disk is full, in every DiskFullError of a run (checkpoints, the final model).
MAKE_ROOM = "free space (earlier runs under project.exp_dir) or point project.exp_dir at a disk with room"


def checkpoint_step(ckpt: Path) -> int:
    """The training step a checkpoint directory (`step_{N:06d}`) holds."""
    return int(ckpt.name.removeprefix("step_"))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint, or None. Half-written temp dirs are ignored. The `latest`
    pointer names a checkpoint of this directory, `step_NNNNNN`, and nothing else: a run
    directory from elsewhere must not lead a resume to load files outside it."""
    if not ckpt_root.is_dir():
        return None
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        name = pointer.read_text(errors="replace").strip()
        if not re.fullmatch(r"step_\d{6,}", name):
            raise RunDataError(f"{pointer} names {name[:80]!r}, not a checkpoint of {ckpt_root} (step_NNNNNN): "
                               "this run directory was changed by hand or comes from elsewhere. Delete the file "
                               "to resume from the newest complete checkpoint there.")
        candidate = ckpt_root / name
        if (candidate / _COMPLETE).is_file():
            return candidate
    complete = sorted(p for p in ckpt_root.glob("step_*") if (p / _COMPLETE).is_file())
    return complete[-1] if complete else None


def cleanup_partial(ckpt_root: Path) -> None:
    """Remove the temp dirs (and `latest` temp files) left by a run killed mid-save."""
    if ckpt_root.is_dir():
        for tmp in ckpt_root.glob(".tmp-step_*"):
            shutil.rmtree(tmp, ignore_errors=True)
        for tmp in ckpt_root.glob(".latest.*.tmp"):
            tmp.unlink(missing_ok=True)
