"""A full disk while a checkpoint is written: one clear error naming the directory, the free
space and how to go on (no torch traceback), the earlier checkpoint intact and no temp dir left;
any other write error is raised as it was."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from ajet.config.schema import TrainerConfig
from ajet.errors import DiskFullError, SetupError
from ajet.training import checkpoint
from ajet.training.checkpoint import load_checkpoint, save_checkpoint
from ajet.training.optim import build_optimizer
from tests.unit.tiny_models import tiny_llama


def _parts():
    model = tiny_llama()
    optimizer, scheduler = build_optimizer(model, TrainerConfig(lr=1e-3))
    return model, optimizer, scheduler


def _save(root: Path, step: int, model, optimizer, scheduler) -> Path:  # noqa: ANN001
    return save_checkpoint(root, step, model=model, optimizer=optimizer, scheduler=scheduler, extra={},
                           keep_last=0)


def torch_disk_full(path: Path, obj: object) -> None:
    """What torch.save raised when the disk filled up (2026-11-27): a RuntimeError raised while
    handling the OSError."""
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 644332096") from None


def test_a_full_disk_names_the_place_and_the_fix_and_keeps_the_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer, scheduler = _parts()
    root = tmp_path / "checkpoints"
    first = _save(root, 1, model, optimizer, scheduler)
    monkeypatch.setattr(checkpoint, "_save", torch_disk_full)
    with pytest.raises(DiskFullError) as info:
        _save(root, 2, model, optimizer, scheduler)
    message = str(info.value)
    assert isinstance(info.value, SetupError) and info.value.exit_code == 1
    assert str(root) in message and "step_000002" in message and "no space left on device" in message
    assert "MiB free" in message and "newest: step_000001" in message and "--resume" in message
    # how much room the run needs: the checkpoint's own size (what step_000001 takes on disk)
    written = sum(f.stat().st_size for f in first.iterdir()) / 2**20
    need = float(message.split("takes about ")[1].split(" MiB")[0])
    assert abs(need - written) <= max(1.0, 0.05 * written), (need, written)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # no temp dir left
    monkeypatch.undo()
    assert load_checkpoint(first, model=model, optimizer=optimizer, scheduler=scheduler)["step"] == 1


def test_a_full_disk_before_any_checkpoint_says_to_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer, scheduler = _parts()
    monkeypatch.setattr(checkpoint, "_save", lambda path, obj: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(DiskFullError, match="then rerun\\.$"):
        _save(tmp_path / "checkpoints", 1, model, optimizer, scheduler)


def test_other_write_errors_are_raised_as_they_were(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer, scheduler = _parts()

    def denied(path: Path, obj: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpoint, "_save", denied)
    with pytest.raises(PermissionError):
        _save(tmp_path / "checkpoints", 1, model, optimizer, scheduler)
    monkeypatch.setattr(checkpoint, "_save", lambda path, obj: torch.save(object(), "/nonexistent/x"))
    with pytest.raises((RuntimeError, OSError)) as info:
        _save(tmp_path / "checkpoints", 1, model, optimizer, scheduler)
    assert not isinstance(info.value, DiskFullError)


def test_a_full_disk_while_the_final_model_is_written_says_resume_writes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ajet.training.model import save_final_model

    class Tokenizer:
        def save_pretrained(self, path: Path) -> None:
            torch_disk_full(Path(path), None)

    model = tiny_llama()
    out = tmp_path / "run" / "final_model"
    with pytest.raises(DiskFullError) as info:
        save_final_model(model, Tokenizer(), out, lora=False)
    assert str(out) in str(info.value) and "--resume" in str(info.value) and "MiB free" in str(info.value)
    assert list((tmp_path / "run").iterdir()) == []  # the temp dir is gone, no half final_model
