"""Atomic, resumable checkpoints, the same for every recipe (RL, SFT, DPO).

Layout: RUN/checkpoints/step_{N:06d}/{weights.pt, optimizer.pt, state.pt, .complete} and a
`latest` file naming the newest complete one. A checkpoint is written into a hidden temp
dir and renamed into place, so a run killed at any moment (even SIGKILL) leaves either
the previous checkpoint or the new one, never a half-written one. Finding the newest complete
one (no torch) is `ajet.training.checkpoint_dir`.

`.complete` holds the sha256 of each file, taken as it is written. `--resume` checks them
first (`set_aside_corrupt`): a checkpoint whose bytes changed on disk (one flipped bit in
weights.pt moved weights by up to 1921; one in optimizer.pt turned every weight into NaN after
the next update) is moved aside as `corrupt-step_N`, said in the log, and the run resumes from
the one before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

import torch

from ajet.errors import DiskFullError, RunDataError
from ajet.faults import fault_point, slow_write
from ajet.files import file_sha256, free_mib, fsync_dir, is_disk_full, write_text_atomic
from ajet.training.adapters import adapter_parameters, role_adapters
from ajet.training.checkpoint_dir import _COMPLETE, MAKE_ROOM, checkpoint_step, latest_checkpoint

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler
    from typing_extensions import Buffer

log = logging.getLogger(__name__)

T = TypeVar("T")


def trainable_names(model: torch.nn.Module) -> set[str]:
    """What training changes: all weights (full fine-tuning), or the LoRA adapters, every one of
    them (per-role adapters: also one peft's `set_adapter` left with `requires_grad=False`)."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    for adapter in role_adapters(model):
        names.update(adapter_parameters(model, adapter))
    return names


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Only what training changes (`trainable_names`)."""
    names = trainable_names(model)
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if n in names}


def save_checkpoint(ckpt_root: Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: LRScheduler, extra: Mapping[str, object], keep_last: int) -> Path:
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step:06d}-", dir=ckpt_root))
    weights, optimizer_state = trainable_state_dict(model), optimizer.state_dict()
    try:
        digests = {"weights.pt": _save(tmp / "weights.pt", weights),
                   "optimizer.pt": _save(tmp / "optimizer.pt", optimizer_state)}
        state = {
            "step": step,
            "scheduler": scheduler.state_dict(),
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
            **extra,
        }
        digests["state.pt"] = _save(tmp / "state.pt", state)
        (tmp / _COMPLETE).write_text(json.dumps({"step": step, "sha256": digests}))
        fsync_dir(tmp)
        fault_point("commit")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_text_atomic(ckpt_root / "latest", final.name)
    except (OSError, RuntimeError) as exc:
        if not is_disk_full(exc):
            raise
        need = tensor_mib(weights) + tensor_mib(optimizer_state)
        raise DiskFullError(_disk_full_message(ckpt_root, final.name, need, keep_last)) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _prune(ckpt_root, keep_last)
    log.info("checkpoint saved: %s", final)
    return final


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: LRScheduler) -> dict[str, object]:
    """Restore weights, optimizer, scheduler and RNG; return the saved state (step, reader, ...)."""
    load_trainable_weights(path, model)
    # weights_only: a checkpoint from elsewhere is loaded without running any code it holds.
    optimizer.load_state_dict(_load(path / "optimizer.pt"))
    state_file = path / "state.pt"
    state = _load(state_file)
    scheduler.load_state_dict(_entry(state, "scheduler", dict, state_file))
    rng = _entry(state, "rng", dict, state_file)
    random.setstate(_entry(rng, "python", tuple, state_file))
    torch.set_rng_state(_entry(rng, "torch", torch.Tensor, state_file))
    log.info("resumed from %s (step %d)", path, _entry(state, "step", int, state_file))
    return state


def _entry(state: Mapping[str, object], key: str, kind: type[T], path: Path) -> T:
    """`state[key]`, a `kind`; RunDataError naming the file when it is not (a crafted or foreign file)."""
    value = state.get(key)
    if not isinstance(value, kind):
        raise RunDataError(f"{path} holds {type(value).__name__} as {key!r}, not {kind.__name__}: it was not "
                           "written by ajet. Delete that checkpoint to resume from the one before.")
    return value


def _load(path: Path) -> dict[str, object]:
    """A checkpoint file's tensors and plain data, a dict; never code (`weights_only=True`)."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise RunDataError(f"{path} is missing: the checkpoint {path.parent} is not whole. Delete it to resume "
                           "from the one before.") from None
    except Exception as exc:  # noqa: BLE001 - a torn or crafted file fails in many ways inside the unpickler
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise RunDataError(f"{path} cannot be loaded safely ({first}): it is torn, or holds more than tensors "
                           "and plain data. Delete that checkpoint to resume from the one before.") from exc
    if not isinstance(loaded, dict):  # torch.load's Any: every checkpoint file holds one dict
        raise RunDataError(f"{path} holds {type(loaded).__name__}, not a dict: it was not written by ajet. Delete "
                           "that checkpoint to resume from the one before.")
    return loaded


def load_trainable_weights(path: Path, model: torch.nn.Module) -> None:
    """Copy checkpoint `path`'s weights.pt into `model`, whose trainable parameters must be
    exactly the ones saved (`trainable_names`)."""
    weights = _tensors(path / "weights.pt")
    trainable = trainable_names(model)
    if set(weights) != trainable:
        missing, unexpected = sorted(trainable - set(weights))[:3], sorted(set(weights) - trainable)[:3]
        raise RuntimeError(
            f"checkpoint {path} does not match this model (missing {missing}, unexpected {unexpected}); "
            "was it written with a different model.path or model.lora setting (per_role: the same trainable_targets)?"
        )
    params = dict(model.named_parameters())
    shapes = [(n, tuple(v.shape), tuple(params[n].shape)) for n, v in weights.items() if v.shape != params[n].shape]
    if shapes:
        name, saved, now = shapes[0]
        raise RunDataError(
            f"checkpoint {path} holds weights of another shape than this model ({len(shapes)} tensors, e.g. "
            f"{name}: {list(saved)} saved, {list(now)} now): it was written for another model.path. "
            "--resume-changed accepts other data and settings, never another architecture. The checkpoints "
            "are untouched: resume with the run's own model.path, or start a new run (--fresh).")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    """weights.pt: {name: tensor}; RunDataError when it holds anything else."""
    loaded = _load(path)
    return {name: _entry(loaded, name, torch.Tensor, path) for name in loaded}


def _disk_full_message(ckpt_root: Path, name: str, need_mib: float, keep_last: int) -> str:
    newest = latest_checkpoint(ckpt_root)
    then = (f"the checkpoints already written are intact (newest: {newest.name}); {MAKE_ROOM}, then rerun "
            "with --resume to continue from it" if newest else f"{MAKE_ROOM}, then rerun")
    kept = (f"; trainer.keep_checkpoints={keep_last} keeps up to {keep_last + 1} on disk while the newest "
            f"is written: about {(keep_last + 1) * need_mib:.0f} MiB" if keep_last else "")
    return (f"checkpoint {name} could not be written to {ckpt_root}: no space left on device "
            f"({free_mib(ckpt_root):.0f} MiB free there). A checkpoint of this run takes about {need_mib:.0f} MiB"
            f"{kept}. Nothing was half-written: {then}.")


def tensor_mib(obj: object) -> float:
    """The MiB of the tensors in `obj` (nested dicts, lists and tuples): what saving it writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() / 2**20
    if isinstance(obj, dict):
        return sum(tensor_mib(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_mib(v) for v in obj)
    return 0.0


class _Hashing:
    """A file written through: the sha256 of what passed."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.digest = handle, hashlib.sha256()

    def write(self, data: Buffer) -> int:
        self.digest.update(data)
        return int(self.handle.write(data))

    def flush(self) -> None:
        self.handle.flush()


def _save(path: Path, obj: object) -> str:
    """`obj` into `path`, synced; the sha256 of the bytes written."""
    slow_write()  # the kill-anywhere tests: a stop that races the write lands inside it
    with open(path, "wb") as handle:
        hashing = _Hashing(handle)
        torch.save(obj, hashing)  # type: ignore[arg-type]  # a writable file object: write() and flush()
        handle.flush()
        os.fsync(handle.fileno())
    return hashing.digest.hexdigest()


# The files a checkpoint holds, each with its sha256 in `.complete`.
CHECKPOINT_FILES = ("weights.pt", "optimizer.pt", "state.pt")


def corruption(ckpt: Path) -> str:
    """What is wrong with checkpoint `ckpt`'s bytes ("" when its files match the sha256 that
    `.complete` holds; a checkpoint written before checksums has none to check)."""
    try:
        recorded = json.loads((ckpt / _COMPLETE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""  # the old marker: the step number alone
    sums = recorded.get("sha256") if isinstance(recorded, dict) else None
    for name, expected in (sums or {}).items():
        if name not in CHECKPOINT_FILES:  # a crafted marker must not make a resume read elsewhere
            return f".complete names {str(name)[:80]!r}, not a file of a checkpoint"
        try:
            digest = file_sha256(ckpt / name)
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
        if digest != expected:
            return f"{name} does not match the sha256 written with it"
    return ""


def set_aside_corrupt(ckpt_root: Path) -> None:
    """Before a resume: while the newest complete checkpoint's files fail their checksums, move
    it aside (`corrupt-step_N`, kept for a look) and say so; the resume then takes the one before."""
    while (newest := latest_checkpoint(ckpt_root)) is not None and (problem := corruption(newest)):
        aside = ckpt_root / f"corrupt-{newest.name}"
        suffix = 1
        while aside.exists():
            aside, suffix = ckpt_root / f"corrupt-{newest.name}.{suffix}", suffix + 1
        os.replace(newest, aside)
        (ckpt_root / "latest").unlink(missing_ok=True)  # it may name the one set aside
        before = latest_checkpoint(ckpt_root)
        log.warning("--resume: checkpoint %s is corrupt (%s): moved to %s; resuming from %s", newest.name, problem,
                    aside.name, f"step {checkpoint_step(before)}" if before else "the start (no checkpoint before it)")
        if before is not None:
            write_text_atomic(ckpt_root / "latest", before.name)


def apply_lr(scheduler: LRScheduler, configured: list[float | torch.Tensor], step: int) -> None:
    """A resume whose `trainer.lr` differs from the checkpoint's: the schedule goes on from `step`
    with the configured rate (the checkpoint's schedule state holds the old one), and the log says so."""
    saved = list(scheduler.base_lrs)
    if saved == configured:
        return
    scheduler.base_lrs = list(configured)
    for group, base in zip(scheduler.optimizer.param_groups, configured, strict=True):
        group["initial_lr"] = base
    scheduler.last_epoch -= 1  # step() recomputes the rate of the same step from the new base
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": by design here
        scheduler.step()
    log.warning("--resume: trainer.lr is %s in this config and %s in the checkpoint: the schedule goes on "
                "from step %d with %s", configured[0], saved[0], step, configured[0])


def _prune(ckpt_root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    complete = sorted(p for p in ckpt_root.glob("step_*") if (p / _COMPLETE).is_file())
    for old in complete[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
