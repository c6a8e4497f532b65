"""What constrains a chat call's reply: the forced start of a `tool_choice`, or a grammar.

`tool_choice` "required" / "any" / a function name starts the reply with the tool-call markup
(`ajet.engine.chat.tool_choice_prefix`), which is prompt: the model writes the rest. On an engine
that `supports_grammar` a grammar (`ajet.engine.grammar`) does more, its forced tokens context and
its sampled ones recorded with the unmasked model's logprobs:

- `rollout.tool_call_grammar` "forced" (the default) decodes a forced call under its tool's
  JSON schema, "all" every call, also the ones the model starts itself;
- a tool sent with `strict: true` has its arguments decoded under its schema whether the call
  was forced or started by the model;
- `parallel_tool_calls: false` allows at most one call per reply (else calls the model starts
  may follow one another, one per line);
- `response_format` (`json_schema` / `json_object`) holds the reply to JSON. A forced tool call
  wins over it (as in vLLM: the reply is the call); with tool_choice "auto" the reply is a call
  or JSON in the format.

An engine without grammars decodes freely (a forced call still starts with its prefix; the log
says so once per engine type); what it cannot honour at all is refused by name:
`parallel_tool_calls: false`, and a `response_format` together with tools the model may call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ajet.config.schema import RolloutConfig
from ajet.engine.base import InferenceEngine
from ajet.engine.chat import chosen_function, tool_choice_prefix
from ajet.engine.grammar import Grammar, call_or_json_grammar, json_grammar, tool_call_grammar
from ajet.tuner.errors import UNSUPPORTED, InvalidRequestError

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


@dataclass(frozen=True)
class _Request:
    """What of a request decides its decoding."""

    tools: list[dict[str, Any]]  # [] when none may be called (none offered, or tool_choice "none")
    tool_choice: str | dict | None
    response_format: dict | None
    parallel: bool  # parallel_tool_calls (None: true)

    @property
    def forced_call(self) -> bool:
        return bool(self.tools) and self.tool_choice not in (None, "auto")

    @property
    def strict(self) -> frozenset[str]:
        """The tools sent with `strict: true`."""
        return frozenset(str(_function(t).get("name")) for t in self.tools if _function(t).get("strict") is True)


def decoding(engine: InferenceEngine, rollout: RolloutConfig, tools: list[dict] | None,
             tool_choice: str | dict | None, response_format: dict | None,
             parallel_tool_calls: bool | None = None) -> Decoding:
    """The prefix and grammar of a call (InvalidRequestError, naming the field, for a choice,
    format or combination that cannot be honoured)."""
    _check_format(response_format)
    callable_tools = list(tools or []) if tool_choice != "none" else []
    request = _Request(callable_tools, tool_choice, response_format, parallel_tool_calls is not False)
    try:
        prefix = tool_choice_prefix(tool_choice, tools)
        grammar = _grammar(engine, rollout, request)
    except InvalidRequestError:
        raise
    except ValueError as err:  # a tool_choice naming no offered tool, a grammar that cannot be built
        raise InvalidRequestError(str(err), "tool_choice") from None
    # the grammar forces the call's markup itself (as context)
    return Decoding("" if grammar is not None else prefix, grammar)


def _check_format(response_format: dict | None) -> None:
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in _FORMATS:
        raise InvalidRequestError(
            f"response_format={response_format!r}: type must be 'json_schema', 'json_object' or 'text'"[:300],
            "response_format")
    if kind == "json_schema" and not isinstance(response_format.get("json_schema") or {}, dict):
        raise InvalidRequestError("response_format.json_schema must be an object with a 'schema'", "response_format")


def _json_format(request: _Request) -> tuple[dict[str, Any] | None, bool] | None:
    """(schema, strict) of a JSON response_format (schema None: any JSON object), else None."""
    fmt = request.response_format or {}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        return spec.get("schema"), bool(spec.get("strict"))
    return (None, False) if fmt.get("type") == "json_object" else None


def _grammar(engine: InferenceEngine, rollout: RolloutConfig, request: _Request) -> Grammar | None:
    """The grammar a call decodes under, or None (see the module docstring)."""
    mode, fmt, tools = rollout.tool_call_grammar, _json_format(request), request.tools
    if request.forced_call:  # a forced call wins over the response_format
        wanted = mode in ("forced", "all") or bool(request.strict) or not request.parallel
        if not wanted or not _can_constrain(engine, request):
            return None
        schemas = None if mode in ("forced", "all") else request.strict
        chosen = request.tool_choice
        name = None if chosen in ("required", "any") else chosen_function(chosen)
        return tool_call_grammar(tools, name, schemas=schemas)
    schemas = None if mode == "all" else request.strict
    if tools and fmt is not None:
        if not engine.supports_grammar:
            raise InvalidRequestError(
                "response_format with tools the model may call (tool_choice auto): this backbone's engine "
                "cannot constrain decoding, so the reply could not be held to a tool call or the format; send "
                "one of response_format and tools, or tool_choice 'none' or a forced choice", "response_format",
                UNSUPPORTED)
        return call_or_json_grammar(tools, fmt[0], strict=fmt[1], schemas=schemas, several=request.parallel)
    if tools and (mode == "all" or request.strict or not request.parallel):
        if not _can_constrain(engine, request):
            return None
        return tool_call_grammar(tools, triggered=True, schemas=schemas, several=request.parallel)
    if fmt is not None and _can_constrain(engine, request):
        return json_grammar(fmt[0], strict=fmt[1])
    return None


def _can_constrain(engine: InferenceEngine, request: _Request) -> bool:
    """Whether the engine decodes under a grammar; without one, `parallel_tool_calls: false` is
    refused (nothing else could stop a second call) and the rest is decoded freely, logged once."""
    if engine.supports_grammar:
        return True
    if request.tools and not request.parallel:
        raise InvalidRequestError(
            "parallel_tool_calls: false needs an engine that constrains decoding to stop a second call "
            "(the debug backbone's does); leave it out or send true", "parallel_tool_calls", UNSUPPORTED)
    name = type(engine).__name__
    if name not in _WARNED_NO_GRAMMAR:  # once per engine type, not per episode
        _WARNED_NO_GRAMMAR.add(name)
        log.warning("the inference engine %s cannot constrain decoding to a grammar; forced tool calls, "
                    "strict tools and response_format are decoded freely", name)
    return False


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function", tool) if isinstance(tool, dict) else {}
    return function if isinstance(function, dict) else {}
