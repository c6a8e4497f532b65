"""Agent dialogs for SFT: one JSON object per line.

```json
{"messages": [{"role": "system", ...}, {"role": "user", ...},
              {"role": "assistant", "content": null, "tool_calls": [...]},
              {"role": "tool", "tool_call_id": "...", "content": "..."},
              {"role": "assistant", "content": "..."}],
 "tools": [{"type": "function", "function": {...}}],
 "target_tools": ["calculate"], "task_type": "math", "loss": 1.7}
```

Only `messages` is required (with at least one assistant turn). `id` names the dialog
(default `<file stem>-<line>`); `loss` is a precomputed difficulty that coreset
selection uses instead of asking the model; an assistant message with `"weight": 0`
stays in the context but is not trained (the OpenAI fine-tuning convention).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ajet.errors import DialogDataError
from ajet.task_reader.jsonl import decode_utf8_line

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Dialog:
    dialog_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    target_tools: list[str] = field(default_factory=list)
    task_type: str = ""
    loss: float | None = None  # precomputed difficulty (mean NLL per trained token)


def dialog_from_row(row: Any, default_id: str) -> Dialog:
    """One record as a `Dialog`, or `ValueError` saying what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of chat messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError(f"messages[{i}] needs a 'role' in {ROLES}, got {message!r:.80}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("no assistant message: there is nothing to train on")
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError("'tools' must be a list of OpenAI-style tool specs")
    target = row.get("target_tools", [])
    if not isinstance(target, list) or not all(isinstance(t, str) for t in target):
        raise ValueError("'target_tools' must be a list of tool names")
    loss = row.get("loss")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
        raise ValueError(f"'loss' must be a number, got {loss!r}")
    task_type = row.get("task_type", "")
    if not isinstance(task_type, str):
        raise ValueError("'task_type' must be a string")
    dialog_id = row.get("id", row.get("dialog_id", default_id))
    return Dialog(
        dialog_id=str(dialog_id), messages=messages, tools=tools or None, target_tools=target,
        task_type=task_type, loss=None if loss is None else float(loss),
    )


def read_dialogs(path: str | Path) -> list[Dialog]:
    """All dialogs of a JSONL file; the first malformed line raises `DialogDataError`."""
    path = Path(path)
    if not path.is_file():
        raise DialogDataError(f"dialog file not found: {path} (set sft.train_path / sft.dev_path)")
    dialogs: list[Dialog] = []
    seen: dict[str, int] = {}
    with path.open("rb") as handle:  # bytes: a line that is not UTF-8 is reported like any bad line
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = decode_utf8_line(raw)
            except ValueError as exc:
                raise DialogDataError(f"{path}:{lineno}: {exc}") from None
            if not line.strip():
                continue
            try:
                dialog = dialog_from_row(json.loads(line), f"{path.stem}-{lineno}")
            except json.JSONDecodeError as exc:
                raise DialogDataError(f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            except ValueError as exc:
                raise DialogDataError(f"{path}:{lineno}: malformed dialog: {exc}") from None
            if dialog.dialog_id in seen:
                raise DialogDataError(
                    f"{path}:{lineno}: duplicate id '{dialog.dialog_id}' (first on line "
                    f"{seen[dialog.dialog_id]}); dialog ids must be unique"
                )
            seen[dialog.dialog_id] = lineno
            dialogs.append(dialog)
    if not dialogs:
        raise DialogDataError(f"{path}: no dialogs; write one JSON object with 'messages' per line")
    return dialogs


def split_dev(dialogs: list[Dialog], fraction: float, seed: int) -> tuple[list[Dialog], list[Dialog]]:
    """Hold out `round(len * fraction)` dialogs (at least one) as the dev set; both keep file order."""
    if fraction <= 0:
        return list(dialogs), []
    n_dev = max(1, round(len(dialogs) * fraction))
    if n_dev >= len(dialogs):
        raise DialogDataError(f"sft.dev_fraction={fraction} holds out all {len(dialogs)} dialogs; lower it")
    order = list(range(len(dialogs)))
    random.Random(seed).shuffle(order)
    dev = set(order[:n_dev])
    return [d for i, d in enumerate(dialogs) if i not in dev], [d for i, d in enumerate(dialogs) if i in dev]
