"""Content deltas of a reply while it is generated (for `stream=true` on the gateway).

`TextStream.push(token_id)` is the engine's `on_token`. After each token, the reply so far
is decoded as the agent will finally receive it (`completion_text`: no EOS, cut before a
stop string). The stream then passes on only the part that can no longer change:

- nothing from a `<tool_call>` on: that becomes `tool_calls` in the final message, and
  the stream of content ends there;
- not a tail that may be the start of `<tool_call>` or of a stop string;
- not trailing whitespace (the content of a reply with tool calls is stripped), nor a
  trailing U+FFFD (a character whose bytes are still coming).

What was passed on is a prefix of the final content in all but one case: a reply that
starts with whitespace and turns out to hold a tool call, whose content is stripped. The
gateway sends the rest of the final content at the end (`rest`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"


def settled_text(text: str, stops: list[str]) -> tuple[str, bool]:
    """(the part of `text` that can be streamed, whether a tool call began) (pure)."""
    at = text.find(TOOL_CALL_OPEN)
    ended = at >= 0
    if ended:
        text = text[:at]
    else:
        held = 0
        for marker in [TOOL_CALL_OPEN, *stops]:
            for k in range(min(len(marker) - 1, len(text)), 0, -1):
                if text.endswith(marker[:k]):
                    held = max(held, k)
                    break
        text = text[: len(text) - held]
    return text.rstrip().rstrip("\ufffd").rstrip(), ended


def completion_text(chat: Any, token_ids: list[int], stop: list[str]) -> str:
    """The reply text the agent receives: the completion decoded without its final EOS,
    cut before the first stop string (OpenAI semantics). Pure given `chat`."""
    ids = list(token_ids)
    while ids and ids[-1] in chat.eos_token_ids:
        ids.pop()
    text = chat.decode(ids)
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


class TextStream:
    def __init__(self, chat: Any, stops: list[str], emit: Callable[[str], None]) -> None:
        self.chat = chat
        self.stops = list(stops)
        self.emit = emit
        self.ids: list[int] = []
        self.sent = ""
        self.ended = False

    def push(self, token_id: int) -> None:
        if self.ended:
            return
        self.ids.append(token_id)
        text, self.ended = settled_text(completion_text(self.chat, self.ids, self.stops), self.stops)
        if len(text) > len(self.sent) and text.startswith(self.sent):
            self.emit(text[len(self.sent):])
            self.sent = text


def rest(sent: str, content: str) -> str:
    """What is left to send of the final `content` after the deltas `sent` (pure)."""
    return content[len(sent):] if content.startswith(sent) else ""
