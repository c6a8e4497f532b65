"""JSONL tasks: one JSON object per line, mapped onto `WorkflowTask`.

Field mapping (`row_to_task`, also used by the HF-dataset and generate readers):
- `task_id`: kept (numbers become strings); default `<file stem>-<line number>`.
- the query: the first of `main_query`, `question`, `query`, `prompt` (the key used is
  not copied into metadata again).
- `init_messages` (list of chat messages) and `env_type` (string): kept.
- `metadata` (object) plus every other field (e.g. `answer`, `numbers`, `target`) goes into
  `task.metadata`; top-level fields win over the same key inside `metadata`.
A row needs a query or `init_messages`; otherwise it is malformed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ajet.config.schema import OnError
from ajet.task_reader.base import TaskReaderError
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)

QUERY_KEYS = ("main_query", "question", "query", "prompt")
_TASK_FIELDS = ("task_id", "init_messages", "env_type", "metadata")


class MalformedRow(ValueError):
    """One row cannot become a task; the message says what is wrong."""


def row_to_task(row: Any, default_id: str) -> WorkflowTask:
    """Map one record to a `WorkflowTask`, or raise `MalformedRow` saying what is wrong."""
    if not isinstance(row, dict):
        raise MalformedRow(f"expected a JSON object, got {type(row).__name__}")
    query_key = next((k for k in QUERY_KEYS if row.get(k) not in (None, "")), None)
    query = row[query_key] if query_key else ""
    if not isinstance(query, str):
        raise MalformedRow(f"'{query_key}' must be a string, got {type(query).__name__}")
    if not query and not row.get("init_messages"):
        raise MalformedRow(
            f"no query: give one of {', '.join(QUERY_KEYS)} (a non-empty string) or init_messages"
        )
    task_id = row.get("task_id", default_id)
    if isinstance(task_id, (int, float)) and not isinstance(task_id, bool):
        task_id = str(task_id)
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise MalformedRow(f"'metadata' must be an object, got {type(metadata).__name__}")
    metadata = dict(metadata)
    for key, value in row.items():
        if key not in _TASK_FIELDS and key != query_key:
            metadata[key] = value
    try:
        return WorkflowTask(
            task_id=task_id,
            main_query=query,
            init_messages=row.get("init_messages") or [],
            env_type=row.get("env_type") or "",
            metadata=metadata,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise MalformedRow(problems) from None


def read_jsonl_tasks(path: str | Path, on_error: OnError = OnError.fail) -> tuple[list[WorkflowTask], int]:
    """Read tasks from a JSONL file; return (tasks, number of skipped lines).

    `on_error=fail` raises `TaskReaderError` at the first malformed line, naming `file:line`;
    `skip` logs a warning naming it and counts it.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskReaderError(f"task file not found: {path}")
    tasks: list[WorkflowTask] = []
    seen: dict[str, int] = {}
    skipped = 0
    # Binary mode, decoded line by line: one line of non-UTF-8 garbage is one malformed
    # line (file:line, skippable), not a UnicodeDecodeError that ends the whole read.
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                task = _parse_line(decode_utf8_line(raw), f"{path.stem}-{lineno}")
                if task.task_id in seen:
                    raise MalformedRow(
                        f"duplicate task_id '{task.task_id}' (first on line {seen[task.task_id]}); "
                        "task ids must be unique"
                    )
            except MalformedRow as exc:
                where = f"{path}:{lineno}"
                if OnError(on_error) == OnError.fail:
                    raise TaskReaderError(
                        f"{where}: malformed task: {exc}. Fix the line, or set "
                        "task_reader.jsonl.on_error=skip to skip malformed lines."
                    ) from None
                logger.warning("%s: skipping malformed task: %s", where, exc)
                skipped += 1
                continue
            seen[task.task_id] = lineno
            tasks.append(task)
    if not tasks:
        detail = f" ({skipped} malformed lines skipped)" if skipped else ""
        raise TaskReaderError(
            f"{path}: no tasks{detail}. Write one JSON object per line, "
            'e.g. {"question": "What is 2+3?", "answer": "5"}'
        )
    return tasks, skipped


def decode_utf8_line(raw: bytes) -> str:
    """One line of a JSONL file as text; `MalformedRow` (a ValueError) saying where UTF-8 breaks."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 4]
        raise MalformedRow(
            f"not valid UTF-8 (byte {bad[:1]!r} at column {exc.start + 1}, starting {bad!r}); "
            "save the file as UTF-8"
        ) from None


def _parse_line(line: str, default_id: str) -> WorkflowTask:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise MalformedRow(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    return row_to_task(row, default_id)
