"""The one progress display of a training run: a live rich bar, or plain log lines when quiet.

Quiet mode is used when `logging.quiet` is set, when stdout is not a terminal (CI
logs) or when CI=true.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("ajet.progress")


def is_quiet(requested: bool) -> bool:
    return requested or not sys.stdout.isatty() or os.environ.get("CI", "").lower() == "true"


# (metric, label, format) shown on the step line when the step reports it (RL, SFT and DPO);
# then each role's reward in a multi-agent run (`role_rewards_text`) and `rollout/failed` with
# its reasons (`failed_counts`).
SHOWN = (
    ("reward/mean", "reward", ".3f"),
    ("success/rate", "success", ".2f"),
    ("agent/tool_call_rate", "tools", ".2f"),
    ("agent/calls_per_episode", "calls", ".1f"),
    ("sft/loss", "loss", ".4f"),
    ("dpo/loss", "loss", ".4f"),
    ("dpo/pairs", "pairs", ".0f"),
    ("perf/tokens_per_s", "tok/s", ".0f"),
)


class TrainingProgress:
    def __init__(self, total_steps: int, start_step: int, *, quiet: bool, max_minutes: float = 0.0) -> None:
        self.total = total_steps
        self.max_minutes = max_minutes  # `trainer.max_minutes`: the eta is never past it (0 = none)
        self.quiet = is_quiet(quiet)
        self._start = time.monotonic()
        self._start_step = start_step
        self._progress: Any = None
        self._task: Any = None
        if not self.quiet:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
                refresh_per_second=2,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, stats="starting…")
            self._progress.start()

    def phase(self, text: str) -> None:
        """What the current step is doing (rollout, update, validation)."""
        if self._progress is not None:
            self._progress.update(self._task, stats=text)

    def step_done(self, step: int, metrics: dict[str, float], *, signs: Sequence[str] = ()) -> None:
        """Show the step's line; `signs` names the signs of not learning that hold at this step
        (`ajet.outputs.learning_signs`), after the failures."""
        shown = [f"{label} {metrics[key]:{fmt}}" for key, label, fmt in SHOWN if key in metrics]
        roles = role_rewards_text(metrics)
        if roles:
            shown.append(f"roles {roles}")
        if "rollout/failed" in metrics:  # failures by reason, last: a run failing says why
            shown.append(f"failed {failed_counts(metrics)}")
        if signs:
            shown.append(f"not learning? {', '.join(signs)}")
        line = "  ".join([f"step {step}/{self.total}", *shown])
        done = step - self._start_step
        if done > 0:
            elapsed = time.monotonic() - self._start
            eta = elapsed / done * (self.total - step)
            if self.max_minutes > 0:
                eta = max(0.0, min(eta, self.max_minutes * 60 - elapsed))
            line += f"  eta {eta:.0f}s"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=line.split("  ", 1)[1])
            self._progress.console.log(line)
        else:
            log.info(line)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def role_names(metrics: dict[str, Any], prefix: str = "") -> list[str]:
    """The roles with a `<prefix>role/<name>/reward` metric (multi-agent runs), sorted."""
    start, end = f"{prefix}role/", "/reward"
    return sorted(k[len(start):-len(end)] for k in metrics if k.startswith(start) and k.endswith(end))


def role_rewards_text(metrics: dict[str, float]) -> str:
    """"villager 0.25, wolf 0.75": each role's mean reward (`role/<name>/reward`), "" without."""
    return ", ".join(f"{role} {metrics[f'role/{role}/reward']:.2f}" for role in role_names(metrics))


def failed_counts(metrics: dict[str, float]) -> str:
    """"0", or e.g. "12/16 (workflow_error:RuntimeError 10, timeout 2)": failures by reason,
    most frequent first, so a run whose episodes all fail shows why on every step."""
    failed = int(metrics.get("rollout/failed", 0))
    if not failed:
        return "0"
    prefix = "rollout/failed/"
    reasons = sorted(((int(v), k[len(prefix):]) for k, v in metrics.items()
                      if k.startswith(prefix) and v), reverse=True)
    shown = ", ".join(f"{reason} {n}" for n, reason in reasons[:3])
    more = ", …" if len(reasons) > 3 else ""
    return f"{failed}/{int(metrics.get('rollout/episodes', failed))} ({shown}{more})"
