"""One metrics interface for the whole run: JSONL always, TensorBoard/wandb/swanlab when enabled."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ajet.config.schema import LoggingConfig

log = logging.getLogger(__name__)


class MetricsLogger:
    """`log(step, metrics, split)` appends to RUN/metrics.jsonl and mirrors to the enabled sinks.

    `resume_step`: a resumed run continues after this step; what an earlier attempt logged past
    it (metrics written before a checkpoint that never completed) is dropped from metrics.jsonl
    and TensorBoard, so every step appears exactly once."""

    def __init__(self, run_dir: Path, cfg: LoggingConfig, *, run_name: str, config_dict: dict[str, Any],
                 resume_step: int | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            truncate_metrics(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._tb = None
        self._wandb = None
        self._swanlab = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        if cfg.wandb:
            self._wandb = _optional_sink("wandb", run_dir, run_name, config_dict)
        if cfg.swanlab:
            self._swanlab = _optional_sink("swanlab", run_dir, run_name, config_dict)

    def log(self, step: int, metrics: dict[str, float], split: str = "train") -> None:
        clean = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        record = {"step": step, "split": split, "time": time.time(), **clean}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())  # a logged step survives a power cut as its checkpoint does
        if self._tb is not None:
            for key, value in clean.items():
                self._tb.add_scalar(key if split == "train" or key.startswith("val/") else f"{split}/{key}", value, step)
            self._tb.flush()
        for sink in (self._wandb, self._swanlab):
            if sink is not None:
                sink.log(clean, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        for sink in (self._wandb, self._swanlab):
            if sink is not None:
                sink.finish()


def truncate_metrics(path: Path, last_step: int) -> int:
    """Keep only the records of steps <= `last_step` (atomic rewrite); return how many were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):  # a line cut by a kill mid-write
                dropped += 1
                continue
            if step <= last_step:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(path)
        log.info("--resume: dropped %d metrics record(s) past step %d from %s", dropped, last_step, path)
    return dropped


def _is_number(value: Any) -> bool:
    """Numbers are logged, NaN and inf included: a diverged loss must show, not vanish."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional_sink(name: str, run_dir: Path, run_name: str, config_dict: dict[str, Any]) -> Any:
    if importlib.util.find_spec(name) is None:
        log.warning("logging.%s is enabled but the '%s' package is not installed; skipping it (pip install %s)", name, name, name)
        return None
    module = __import__(name)
    module.init(project="ajet", name=run_name, config=config_dict, dir=str(run_dir))
    return module


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl; for a resumed run the last record of a (step, split) wins.
    A line a kill cut short is skipped with a warning (`read_jsonl`)."""
    latest: dict[tuple[int, str], dict[str, Any]] = {}
    for rec in read_jsonl(path):
        if isinstance(rec.get("step"), int):
            latest[(rec["step"], rec.get("split", "train"))] = rec
    return [latest[k] for k in sorted(latest)]


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a malformed line (a live run mid-write, or one a kill cut
    short) is skipped with a warning."""
    rows: list[dict] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                log.warning("%s:%d: skipping a malformed line (%s)", path, lineno, exc.msg)
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                log.warning("%s:%d: skipping a line that is not a JSON object", path, lineno)
    return rows
