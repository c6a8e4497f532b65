"""An evaluated episode as an SFT dialog (`ajet eval --dialogs PATH`): what a model said, in
the format `ajet sft` trains on (ajet/sft/data.py), e.g. a teacher's sampled dialogs for SFT
on them (off-policy distillation) or the successful ones for rejection-sampling fine-tuning.

An episode's dialog is its last recorded call of each role: that call's messages (the history
as the agent sent it: system prompt, earlier assistant turns, tool calls and their results)
plus the reply it got. Earlier calls of an agent that re-sends its history are inside it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ajet.files import write_text_atomic

# Keys of a reply message that a chat template reads; the rest (ajet's own) is dropped.
_MESSAGE_KEYS = ("role", "content", "tool_calls", "name", "tool_call_id")


def episode_dialogs(episode_id: str, calls: Iterable[Any], *, task_type: str = "") -> list[dict[str, Any]]:
    """One SFT dialog per role of the episode (its last call), in call order."""
    last: dict[str, Any] = {}
    for call in sorted(calls, key=lambda c: c.call_index):
        last[call.role] = call
    out = []
    for role, call in last.items():
        reply = {k: v for k, v in (call.response_message or {}).items() if k in _MESSAGE_KEYS}
        if reply.get("role") != "assistant":
            continue
        row: dict[str, Any] = {"id": f"{episode_id}-{role}" if len(last) > 1 else episode_id,
                               "messages": [*call.messages, reply]}
        if call.tools:
            row["tools"] = call.tools
        if task_type:
            row["task_type"] = task_type
        out.append(row)
    return out


def write_dialogs(path: Path, rows: list[dict[str, Any]]) -> Path:
    """The dialogs as JSONL, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path
