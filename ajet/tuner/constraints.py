"""What constrains a chat call's reply: the forced start of a `tool_choice`, or a grammar.

`tool_choice` "required" / "any" / a function name starts the reply with the tool-call markup
(`ajet.engine.chat.tool_choice_prefix`), which is prompt: the model writes the rest. With
`rollout.tool_call_grammar` ("forced"; "all" for calls the model starts itself too) and an
engine that `supports_grammar`, such a call is decoded under the tool's JSON schema instead
(`ajet.engine.grammar`): it always parses, and the tokens the grammar forces are context.
`response_format` (OpenAI's `json_schema` / `json_object`) constrains the reply to JSON the
same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ajet.config.schema import RolloutConfig
from ajet.engine.base import InferenceEngine
from ajet.engine.chat import chosen_function, tool_choice_prefix
from ajet.engine.grammar import Grammar, json_grammar, tool_call_grammar
from ajet.tuner.errors import InvalidRequestError

log = logging.getLogger(__name__)
_WARNED_NO_GRAMMAR: set[str] = set()  # engine types warned about, once each per process

_FORMATS = ("json_schema", "json_object", "text")


@dataclass(frozen=True)
class Decoding:
    """How one call decodes: `prefix` ends the prompt (a forced call's start, without a
    grammar); `grammar` constrains the completion (None: free text)."""

    prefix: str = ""
    grammar: Grammar | None = None

    @property
    def forced(self) -> bool:
        """The reply is a forced tool call or constrained (its markup closed when cut)."""
        return bool(self.prefix) or self.grammar is not None


def decoding(engine: InferenceEngine, rollout: RolloutConfig, tools: list[dict] | None,
             tool_choice: str | dict | None, response_format: dict | None) -> Decoding:
    """The prefix and grammar of a call (InvalidRequestError for a choice or format that
    cannot be honoured)."""
    try:
        prefix = tool_choice_prefix(tool_choice, tools)
        grammar = _grammar(engine, rollout, tool_choice, tools, response_format)
    except InvalidRequestError:
        raise
    except ValueError as err:  # a tool_choice naming no offered tool, a grammar that cannot be built
        raise InvalidRequestError(str(err)) from None
    # the grammar forces the call's markup itself (as context)
    return Decoding("" if grammar is not None else prefix, grammar)


def _format_kind(response_format: dict | None) -> str | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in _FORMATS:
        raise InvalidRequestError(
            f"response_format={response_format!r}: type must be 'json_schema', 'json_object' or 'text'",
            "response_format")
    return str(kind)


def _grammar(engine: InferenceEngine, rollout: RolloutConfig, tool_choice: str | dict | None,
             tools: list[dict] | None, response_format: dict | None) -> Grammar | None:
    kind = _format_kind(response_format)
    mode = rollout.tool_call_grammar
    auto = tool_choice in (None, "auto")
    calls = bool(tools) and tool_choice != "none" and (mode == "all" or mode == "forced" and not auto)
    if not (calls or kind in ("json_schema", "json_object")):
        return None
    if not engine.supports_grammar:
        name = type(engine).__name__
        if name not in _WARNED_NO_GRAMMAR:  # once per engine type, not per episode
            _WARNED_NO_GRAMMAR.add(name)
            log.warning("the inference engine %s cannot constrain decoding to a grammar; "
                        "forced tool calls and response_format are decoded freely", name)
        return None
    if kind == "json_schema":
        spec: Any = (response_format or {}).get("json_schema") or {}
        if not isinstance(spec, dict):
            raise InvalidRequestError("response_format.json_schema must be an object with a 'schema'",
                                      "response_format")
        return json_grammar(spec.get("schema"), strict=bool(spec.get("strict")))
    if kind == "json_object":
        return json_grammar(None)
    if auto:
        return tool_call_grammar(tools or [], triggered=True)
    if tool_choice in ("required", "any"):
        return tool_call_grammar(tools or [])
    return tool_call_grammar(tools or [], chosen_function(tool_choice))
