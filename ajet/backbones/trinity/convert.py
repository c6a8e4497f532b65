"""Our merged samples -> the fields of Trinity `Experience`s (pure, no trinity import).

A Trinity multi-turn experience is `tokens` (the whole sequence), `prompt_length` (tokens
before the first generated one), and per response token (`tokens[prompt_length:]`):
`action_mask` (trained or not: tool outputs and untrained roles are 0) and `logprobs`.
`reward` is the episode's. Trinity's step-wise GRPO groups experiences by `eid.task` and
`eid.run` and broadcasts the run's advantage to all its steps, so the several samples of
one episode (forks that did not merge) become steps 0..k-1 of one run.

Tasks travel to Trinity as JSON lines `{"ajet_task": "<WorkflowTask as JSON>"}`: one string
column, so Trinity's file reader (HF datasets) never has to infer a schema for metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ajet.backbones.gpu_worker import first_trained
from ajet.context.types import Sample
from ajet.workflow import WorkflowTask


def sample_to_experience_fields(sample: Sample, *, step: int = 0) -> dict[str, Any] | None:
    """Keyword arguments for `trinity.common.experience.Experience(**fields)` (lists, not
    tensors; Experience converts them), or None for a sample without trained tokens."""
    start = first_trained(sample)
    if start <= 0:  # no trained token (or a sample without a prompt, which cannot happen)
        return None
    return {
        "tokens": list(sample.input_ids),
        "prompt_length": start,
        "action_mask": [bool(m) for m in sample.loss_mask[start:]],
        "logprobs": [float(x) for x in sample.old_logprobs[start:]],
        "reward": float(sample.reward),
        # eid.task / eid.run are set by Trinity's runner (task index, repeat index).
        "eid": {"step": step},
        "info": {"episode_id": sample.episode_id, "group_id": sample.group_id, "role": sample.role,
                 "num_calls": sample.num_calls},
    }


def episode_experience_fields(samples: list[Sample], metrics: dict[str, float] | None = None
                              ) -> list[dict[str, Any]]:
    """All trainable samples of one episode, as experience fields numbered as steps (pure).

    The episode's scalar metrics (reward, workflow log metrics) ride on every step. A failed
    episode has no samples (`EpisodeRuntime.run`), hence no experience; Trinity's GRPO groups
    the runs of a task that returned experiences, so the failed run stays out of its group's
    mean and std, as on the debug backbone.
    """
    out: list[dict[str, Any]] = []
    for sample in samples:
        fields = sample_to_experience_fields(sample, step=len(out))
        if fields is None:
            continue
        fields["metrics"] = dict(metrics or {})
        out.append(fields)
    return out


def to_experiences(fields: list[dict[str, Any]]) -> list[Any]:
    """The real Trinity objects (GPU path only: imports trinity)."""
    # the trinity extra: only Trinity's workers call this; the functions above are pure
    from trinity.common.experience import EID, Experience

    out = []
    for f in fields:
        f = dict(f)
        eid = f.pop("eid")
        out.append(Experience(eid=EID(step=eid["step"]), **f))
    return out


TASK_COLUMN = "ajet_task"


def task_to_row(task: WorkflowTask) -> dict[str, str]:
    """One line of the taskset Trinity reads (pure)."""
    return {TASK_COLUMN: task.model_dump_json()}


def task_from_row(row: dict[str, Any]) -> WorkflowTask:
    """The WorkflowTask back from a taskset row (pure)."""
    if TASK_COLUMN not in row:
        raise ValueError(f"taskset row has no {TASK_COLUMN!r} column (keys: {sorted(row)}); "
                         "the taskset must be written by ajet's trinity backbone")
    return WorkflowTask.model_validate_json(row[TASK_COLUMN])


def write_taskset(directory: str | Path, train: list[WorkflowTask], val: list[WorkflowTask]) -> Path:
    """`train.jsonl` (and `validation.jsonl`) under `directory`, Trinity's file taskset layout."""
    import json

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for name, tasks in (("train", train), ("validation", val)):
        path = out / f"{name}.jsonl"
        if not tasks:
            path.unlink(missing_ok=True)
            continue
        path.write_text("".join(json.dumps(task_to_row(t)) + "\n" for t in tasks))
    return out
