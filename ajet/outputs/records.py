"""Token-level records: one JSON line per trained sample (format in docs/outputs.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ajet.context.types import Sample
from ajet.errors import DiskFullError
from ajet.files import free_mib, is_disk_full


def drop_records_after(run_dir: Path, last_step: int) -> int:
    """Delete RUN/records/step_N.jsonl for N > `last_step` (a resumed run writes them again)."""
    dropped = 0
    for path in (run_dir / "records").glob("step_*.jsonl"):
        try:
            step = int(path.stem.removeprefix("step_"))
        except ValueError:
            continue
        if step > last_step:
            path.unlink()
            dropped += 1
    return dropped


def write_step_records(
    run_dir: Path,
    step: int,
    samples: list[Sample],
    *,
    decode_token: Callable[[int], str],
    episode_info: dict[str, dict[str, Any]],
) -> Path:
    """Write RUN/records/step_{step:06d}.jsonl atomically and return its path."""
    out = run_dir / "records" / f"step_{step:06d}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".jsonl.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            for sample in samples:
                handle.write(json.dumps(_record(step, sample, episode_info, decode_token), ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if not is_disk_full(exc):
            raise
        raise DiskFullError(
            f"the token records of step {step} could not be written to {out.parent}: no space left on device "
            f"({free_mib(out.parent):.0f} MiB free there). Step {step} is not committed; the checkpoints already "
            "written are intact. Free space (or set logging.token_records=false), then rerun with --resume.") from exc
    return out


def _record(step: int, sample: Sample, episode_info: dict[str, dict[str, Any]],
            decode_token: Callable[[int], str]) -> dict[str, Any]:
    info = episode_info.get(sample.episode_id, {})
    return {
        "step": step,
        "episode_id": sample.episode_id,
        "task_id": info.get("task_id", sample.group_id),
        "group_id": sample.group_id,
        "role": sample.role,
        "reward": sample.reward,
        "is_success": info.get("is_success"),
        "query": info.get("query", ""),
        "input_ids": sample.input_ids,
        "tokens": [decode_token(t) for t in sample.input_ids],
        "loss_mask": sample.loss_mask,
        "logprobs": [round(x, 5) for x in sample.old_logprobs],
        "advantages": [round(x, 5) for x in (sample.advantage or [0.0] * len(sample.input_ids))],
        "segments": [list(s) for s in sample.segments],
        # why this sample is not merged with the episode's earlier one ("" for the first)
        "break": sample.metadata.get("break", ""),
    }
