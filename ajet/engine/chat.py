"""Chat formatting: OpenAI-style messages (+ tools) to prompt text, and replies back to messages.

`ChatFormat` renders through the tokenizer's own chat template. Many small models' templates
(the bundled SmolLM2's among them) know nothing of tools and fail on `content: None`, so
messages are normalised first:

- content `None` becomes "", a list of `{"type": "text"}` blocks becomes their joined text;
- when the template ignores `tools` (found by rendering with and without them), tools go
  into the system prompt, hermes-style (`<tools>...</tools>` plus instructions), an
  assistant's `tool_calls` are written into its content as
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks, and each `tool`
  message becomes a user turn `<tool_response>\\n...\\n</tool_response>`;
- when the template handles tools itself, tools, `tool_calls` and `tool` messages are passed
  through (tool-call arguments as dicts, the form HF templates expect).

Every message renders on its own (consecutive tool results are not merged), so rendering is
deterministic and, for ChatML templates, prefix-preserving: the rendering of `messages[:k]`
is a textual prefix of the rendering of `messages[:k+1]` (both without generation prompt).

`parse_completion` reads hermes `<tool_call>{json}</tool_call>` blocks out of a reply. A
malformed block (bad JSON, no name) stays in the content as text and the reply is flagged
`malformed_tool_call`; parsing never raises. A small model writes many malformed calls while
it learns, and the metric `agent/valid_tool_call_rate` counts them, so each is logged at DEBUG
level; only the first one in the process is also a WARNING, which says so.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
_malformed_seen = itertools.count()  # malformed tool calls logged so far in this process

_TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "ajet_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}


@dataclass
class ParsedReply:
    """An assistant reply split into text and OpenAI-format tool calls."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    malformed_tool_call: bool = False
    # One entry per tool call accepted after a repair, saying what was repaired.
    repaired: list[str] = field(default_factory=list)


class ChatFormat:
    """Implements `ajet.engine.base.ChatRenderer` with the tokenizer's chat template."""

    def __init__(self, tokenizer: Any, eos_token_ids: set[int] | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat template; use an instruct/chat checkpoint "
                "(its tokenizer_config.json or chat_template.jinja defines one)"
            )
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            eos = tokenizer.eos_token_id
            eos_token_ids = {eos} if eos is not None else set()
        self.eos_token_ids: set[int] = set(eos_token_ids)
        self.native_tools = self._template_uses_tools()
        # The longest token as vocabulary text: no token decodes to more characters (a
        # byte-level token's vocab string has one character per byte), so a text of c
        # characters is at least c / max_token_chars tokens, known without tokenising it.
        self.max_token_chars = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1

    # ------------------------------------------------------------------ render
    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for `messages` (and `tools`) under the model's chat template."""
        if not messages:
            raise ValueError("messages is empty: a chat prompt needs at least one message")
        tools = list(tools) if tools else None
        if self.native_tools:
            normalised = [_native_message(m) for m in messages]
            return self._apply(normalised, tools, add_generation_prompt)
        normalised = [_hermes_message(m) for m in messages]
        if tools:
            normalised = _with_tools_in_system(normalised, tools)
        return self._apply(normalised, None, add_generation_prompt)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to this, exclusive (the tokenizer's, added tokens included)."""
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens only where the text spells them."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        """The exact text of `token_ids`, special tokens included."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def _apply(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool
    ) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = tools
        text = self.tokenizer.apply_chat_template(messages, **kwargs)
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def _template_uses_tools(self) -> bool:
        probe = [{"role": "user", "content": "hi"}]
        return self._apply(probe, [_PROBE_TOOL], False) != self._apply(probe, None, False)

    # ------------------------------------------------------------------ parse
    def parse_completion(self, text: str) -> ParsedReply:
        return parse_completion(text)

    def to_openai_message(self, parsed: ParsedReply) -> dict[str, Any]:
        return to_openai_message(parsed)


def parse_completion(text: str) -> ParsedReply:
    """Split a reply into content and hermes `<tool_call>` blocks (never raises)."""
    tool_calls: list[dict[str, Any]] = []
    kept: list[str] = []  # content pieces, malformed blocks included verbatim
    malformed = False
    repaired: list[str] = []
    cursor = 0
    for match in _TOOL_CALL_RE.finditer(text):
        kept.append(text[cursor : match.start()])
        cursor = match.end()
        call, problem = _parse_tool_call(match.group(1))
        if call is None:
            malformed = True
            _log_malformed("malformed tool call (%s): %.200r", problem, match.group(0))
            kept.append(match.group(0))
        else:
            tool_calls.append(call)
            if problem:  # accepted, after a repair
                repaired.append(problem)
                log.debug("repaired tool call (%s): %r", problem, match.group(0))
    rest = text[cursor:]
    if "<tool_call>" in rest:
        malformed = True
        _log_malformed("unclosed <tool_call> in the reply: %.200r", rest[rest.index("<tool_call>") :])
    kept.append(rest)
    content = "".join(kept).strip() if tool_calls else "".join(kept)
    return ParsedReply(content=content, tool_calls=tool_calls, malformed_tool_call=malformed,
                       repaired=repaired)


def _log_malformed(message: str, *args: Any) -> None:
    """A malformed tool call at DEBUG level; the first one in the process also as a WARNING."""
    if next(_malformed_seen) == 0:  # atomic under the GIL: one WARNING even across threads
        log.warning(message + "; malformed tool calls are counted in the metric "
                    "agent/valid_tool_call_rate, further ones are logged at DEBUG level", *args)
    log.debug(message, *args)


def to_openai_message(parsed: ParsedReply) -> dict[str, Any]:
    """The assistant message an OpenAI client expects for `parsed`."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = [dict(call) for call in parsed.tool_calls]
    return message


def _parse_tool_call(body: str) -> tuple[dict[str, Any] | None, str]:
    """(the OpenAI tool call, "") or (None, why it is malformed) or (the call, what was
    repaired): a call without `arguments` (given `{}`), with `parameters` instead, with
    arguments as a JSON string, or with keys besides these (dropped) is accepted, repaired."""
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return None, f"bad JSON: {exc.msg}"
    if not isinstance(payload, dict):
        return None, "not a JSON object"
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return None, "missing name"
    repairs = []
    if "arguments" in payload:
        arguments = payload["arguments"]
    elif "parameters" in payload:
        arguments = payload["parameters"]
        repairs.append("'parameters' read as 'arguments'")
    else:
        arguments = {}
        repairs.append("no 'arguments', given {}")
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, "arguments are not JSON"
        repairs.append("arguments decoded from a JSON string")
    if not isinstance(arguments, dict):
        return None, "arguments are not a JSON object"
    extra = sorted(set(payload) - {"name", "arguments", "parameters"})
    if extra:
        repairs.append(f"dropped key(s) {extra}")
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }, "; ".join(repairs)


# ---------------------------------------------------------------------- message normalisation
def content_text(content: Any) -> str:
    """Message content as plain text: None → "", text blocks joined with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                raise ValueError(
                    f"message content block of type {kind!r} is not supported: the model is text-only"
                )
        return "\n".join(parts)
    raise ValueError(
        f"message content of type {type(content).__name__} is not supported; use a str or text blocks"
    )


def _function_of(call: dict[str, Any]) -> tuple[str, Any]:
    """(name, arguments as a dict when they parse, else the raw value) of an OpenAI tool call."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # keep the raw string: render what the caller gave
    return function.get("name", ""), arguments


def _hermes_message(message: dict[str, Any]) -> dict[str, str]:
    role = message.get("role")
    if not role:
        raise ValueError(f"message without a role: {message!r}")
    content = content_text(message.get("content"))
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    if role == "assistant" and message.get("tool_calls"):
        blocks = []
        for call in message["tool_calls"]:
            name, arguments = _function_of(call)
            payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            blocks.append(f"<tool_call>\n{payload}\n</tool_call>")
        content = "\n".join(([content] if content else []) + blocks)
    return {"role": role, "content": content}


def tool_choice_prefix(tool_choice: Any, tools: list[dict[str, Any]] | None) -> str:
    """The start of the reply that enforces `tool_choice`, in hermes tool-call markup (pure).

    "" for None / "auto" / "none"; `<tool_call>\n{"name": "` for "required" / "any" (the model
    picks the function); `<tool_call>\n{"name": "NAME", "arguments": {` for a function name or
    `{"type": "function", "function": {"name": NAME}}`. It is written exactly as an assistant's
    tool call renders (`_hermes_message`), so the reply continues a prefix of its own rendering.
    (`rollout.tool_call_grammar` forces more: the whole call follows the tool's JSON schema.)
    Raises ValueError for a choice that names no offered tool, or requires one with none offered.
    """
    if tool_choice in (None, "auto", "none"):
        return ""
    names = [_function_of(t)[0] for t in tools or []]
    if not names:
        raise ValueError(f"tool_choice={tool_choice!r} requires a tool call, but no tools were given")
    if tool_choice in ("required", "any"):
        return '<tool_call>\n{"name": "'
    name = chosen_function(tool_choice)
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"tool_choice={tool_choice!r} names no offered tool; the tools are {names}")
    return '<tool_call>\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": {'


def chosen_function(tool_choice: Any) -> Any:
    """The function a `tool_choice` names: `NAME` or `{"type": "function", "function":
    {"name": NAME}}` (what a caller sent, unchecked; the keywords come back as they are)."""
    if isinstance(tool_choice, dict):
        return (tool_choice.get("function") or {}).get("name")
    return tool_choice


def _native_message(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("role"):
        raise ValueError(f"message without a role: {message!r}")
    out = {k: v for k, v in message.items() if k in ("role", "name", "tool_call_id")}
    out["content"] = content_text(message.get("content"))
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            name, arguments = _function_of(call)
            calls.append(
                {
                    "type": "function",
                    "id": call.get("id", ""),
                    "function": {"name": name, "arguments": arguments},
                }
            )
        out["tool_calls"] = calls
    return out


def _with_tools_in_system(
    messages: list[dict[str, str]], tools: list[dict]
) -> list[dict[str, str]]:
    specs = "".join("\n" + json.dumps(_as_tool_spec(tool), ensure_ascii=False) for tool in tools)
    block = _TOOLS_PREAMBLE + specs + _TOOLS_POSTAMBLE
    if messages and messages[0]["role"] == "system":
        system = messages[0]["content"]
        merged = f"{system}\n\n{block}" if system else block
        return [{"role": "system", "content": merged}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def _as_tool_spec(tool: dict[str, Any]) -> dict[str, Any]:
    if "function" in tool or tool.get("type") == "function":
        return tool
    return {"type": "function", "function": tool}  # a bare function schema
