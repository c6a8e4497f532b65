"""Supervised fine-tuning: the negative log-likelihood of demonstration dialogs
(`ajet.algorithms.losses.sft_loss`), trained by the SFT recipe (ajet/sft) from `sft.train_path`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ajet.algorithms.base import AlgorithmSpec, Problems

if TYPE_CHECKING:
    from ajet.config.schema import AjetConfig


def config_problems(cfg: AjetConfig) -> Problems:
    """The sft stage's data."""
    out: Problems = []
    s = cfg.sft
    if not s.train_path:
        out.append(("sft.train_path", "required for the sft stage: a JSONL file of dialogs"))
    for key, value in (("sft.train_path", s.train_path), ("sft.dev_path", s.dev_path)):
        if value and not Path(value).is_file():
            out.append((key, f"file not found: {value}"))
    bad = {k: v for k, v in s.task_weights.items() if v < 0}
    if bad:
        out.append(("sft.task_weights", f"weights must be >= 0, got {bad}"))
    if s.replay.ratio > 0:
        if s.replay.buffer_size <= 0:
            out.append(("sft.replay.buffer_size", "replay.ratio > 0 needs a buffer_size > 0"))
        if s.rounds < 2:
            out.append(("sft.rounds", "replay mixes earlier rounds into later ones: set sft.rounds >= 2"))
    return out


SPEC = AlgorithmSpec(name="sft", summary="supervised fine-tuning on demonstration dialogs", recipe="sft",
                     config_problems=config_problems,
                     elsewhere="sft is not an RL algorithm and has no GPU adapter; run it on --backbone=debug")
