"""A completion's text as the assistant message an OpenAI client expects (pure).

Tool calls are parsed out of the text (hermes `<tool_call>` markup, `ChatFormat.parse_completion`).
A forced call (a tool choice, or a grammar) that the model ended without its closing markup is
closed where that parses; one cut at max_tokens keeps finish "length" and comes in the protocol's
own shape, never ajet's markup as content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Protocol


class ReplyParser(Protocol):
    """What a reply needs from `ajet.engine.chat.ChatFormat`."""

    def parse_completion(self, text: str) -> Any: ...

    def to_openai_message(self, parsed: Any) -> dict: ...


@dataclass
class Reply:
    message: dict[str, Any]  # {"role": "assistant", "content": ..., "tool_calls": [...]}
    finish_reason: str  # "stop" | "length" | "tool_calls"
    malformed: bool = False
    repaired: int = 0  # tool calls accepted after a repair
    closed: str = ""  # what closing a forced call took (for the log), else ""


def reply(chat: ReplyParser, text: str, finish_reason: str, *, parse: bool, forced: bool) -> Reply:
    """The message of a completion `text` that ended with `finish_reason`. `parse`: read tool
    calls (False for tool_choice "none": markup stays text); `forced`: the reply is a forced or
    grammar-constrained call."""
    if not parse:
        return Reply({"role": "assistant", "content": text}, finish_reason)
    parsed = chat.parse_completion(text)
    closed = ""
    if forced and parsed.malformed_tool_call:
        parsed, closed = close_forced_call(chat, text, parsed)
    malformed = bool(parsed.malformed_tool_call)
    message = chat.to_openai_message(parsed)
    cut = forced and finish_reason == "length"
    if cut and malformed:
        # A forced call cut at max_tokens says so (finish "length"), in the protocol's own
        # shape: closed where its arguments so far parse once closed, else the call so far
        # (its name, its arguments as written), never ajet's markup as content; the complete
        # calls before it (parallel calls under a grammar) are kept.
        done = message.get("tool_calls") or []
        message = cut_tool_call(text)
        message["tool_calls"] = [*done, *message["tool_calls"]]
    finish = "tool_calls" if message.get("tool_calls") and not cut else finish_reason
    return Reply(message, finish, malformed, len(parsed.repaired), closed)


def close_forced_call(chat: ReplyParser, text: str, parsed: Any) -> tuple[Any, str]:
    """A forced tool call the model ended (EOS, stop) without its closing markup is closed:
    `</tool_call>`, with the one or two `}` still open after the arguments. What was sampled is
    recorded unchanged. (the parse, what closing it took: "" when it was not closed)"""
    if "</tool_call>" in text or "<tool_call>" not in text:
        return parsed, ""
    body = text[text.rindex("<tool_call>") + len("<tool_call>"):].rstrip()
    for braces in ("", "}", "}}", '"}', '"}}'):
        try:  # checked quietly first: only a closing that parses is handed to the parser
            json.loads(body + braces)
        except json.JSONDecodeError:
            continue
        closed = chat.parse_completion(text.rstrip() + braces + "\n</tool_call>")
        if closed.malformed_tool_call:
            return parsed, ""
        what = f"closed the forced call with {braces + '</tool_call>'!r}"
        if closed.repaired:
            closed.repaired[-1] = f"{what}; {closed.repaired[-1]}"
        else:
            closed.repaired.append(what)
        return closed, closed.repaired[-1]
    return parsed, ""


def cut_tool_call(text: str) -> dict[str, Any]:
    """The assistant message of a tool call cut at max_tokens, as OpenAI returns one: no content,
    the function's name (when it was written) and its arguments so far, as a string."""
    body = text[text.rindex("<tool_call>") + len("<tool_call>"):] if "<tool_call>" in text else text
    name = re.search(r'"name"\s*:\s*"([^"]*)"', body)
    arguments = re.search(r'"arguments"\s*:\s*(.*)\Z', body, re.S)
    call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name.group(1) if name else "", "arguments": arguments.group(1) if arguments else ""}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}
