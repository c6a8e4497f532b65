"""The OpenAI chat-completions wire format: the request model and response builders.

Pure functions over plain data so that the gateway only routes; what goes over the
wire is tested here without a server.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ajet.engine.sampling import MAX_TOP_LOGPROBS
from ajet.tuner.streaming import rest

MODEL_NAME = "ajet-policy"


# What the gateway does with each field of the chat-completions protocol (docs/gateway.md lists
# them). Honoured: the model's fields below. Accepted with no effect on the reply: fields about
# billing, storage and caching on OpenAI's side. Refused with a 400 that names the field: the
# ones ajet cannot honour, or only some values of (REFUSED_VALUES). A field outside the protocol
# (a framework's own extension) is accepted and ignored, as vLLM does, and logged once.
NO_EFFECT = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"})
REFUSED = {
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy `functions` field is not supported; send `tools`",
    "function_call": "the legacy `function_call` field is not supported; send `tool_choice`",
    "reasoning_effort": "the policy has no reasoning-effort setting",
    "verbosity": "the policy has no verbosity setting",
}
# field -> (the values that are honoured, why others are refused)
REFUSED_VALUES: dict[str, tuple[Any, str]] = {
    "parallel_tool_calls": ((None, True), "ajet cannot stop the model from writing several tool calls in "
                            "one reply (all are returned and trained); leave it out or send true"),
}
PROTOCOL_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "response_format", "temperature",
                             "top_p", "top_k", "max_tokens", "max_completion_tokens", "stop", "seed", "n",
                             "stream", "stream_options", "logprobs", "frequency_penalty", "presence_penalty",
                             "logit_bias", "top_logprobs", *NO_EFFECT, *REFUSED, *REFUSED_VALUES})


def refused_field(payload: dict[str, Any]) -> tuple[str, str] | None:
    """(field, why) for the first field of a request body that ajet refuses, or None."""
    for name, why in REFUSED.items():
        if payload.get(name) is not None:
            return name, f"{name}: {why}"
    for name, (honoured, why) in REFUSED_VALUES.items():
        if name in payload and not any(payload[name] == value for value in honoured):
            return name, f"{name}={json.dumps(payload[name])[:60]}: {why}"
    return None


class ChatCompletionRequest(BaseModel):
    """The fields ajet reads. `refused_field` decides on the others first (REFUSED, REFUSED_VALUES);
    fields outside the protocol are kept as extras, unread. `response_format` json_schema /
    json_object constrains the reply (ajet/engine/grammar.py). `logprobs=true` returns each
    completion token's recorded logprob (the policy at rollout.temperature: what the trainer uses),
    with `top_logprobs` the most likely tokens of that same distribution."""

    model_config = ConfigDict(extra="allow")

    model: str = MODEL_NAME
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM extension; -1 or 0 = off
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    # Applied in sampling (ajet/engine/sampling.py `penalised`); the recorded logprobs are the
    # adjusted distribution's, the one sampled from.
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("messages")
    @classmethod
    def _messages_have_roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                raise ValueError(f"messages[{i}] has no 'role'")
        return messages

    def sampling_overrides(self) -> dict[str, Any]:
        top_k = 0 if self.top_k == -1 else self.top_k
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": top_k,
            "max_tokens": self.max_tokens
            if self.max_tokens is not None
            else self.max_completion_tokens,
            "stop": self.stop,
            "seed": self.seed,
            "n": self.n,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "logit_bias": self.logit_bias,
            "top_logprobs": self.top_logprobs if self.logprobs else None,
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    """OpenAI-style error body: {"error": {"message", "type", "code", "param"}}."""
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def logprobs_content(tokens: list[str], logprobs: list[float],
                     alternatives: list[list[tuple[str, float]]] | None = None) -> dict[str, Any]:
    """The `choices[0].logprobs` object: one entry per completion token, each with its
    `alternatives` (top_logprobs: (token text, logprob), most likely first) where asked."""
    alternatives = alternatives or [[] for _ in tokens]

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
                        for t, lp, top in zip(tokens, logprobs, alternatives, strict=True)]}


def completion_response(
    message: dict[str, Any],
    finish_reason: str,
    usage: dict[str, int],
    *,
    model: str,
    completion_id: str,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `chat.completion` object for a non-streaming request."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": _wire_message(message),
                "finish_reason": finish_reason,
                "logprobs": logprobs,
            }
        ],
        "usage": dict(usage),
    }


def stream_chunk(delta: dict[str, Any], finish: str | None = None, *, model: str, completion_id: str,
                 created: int) -> dict[str, Any]:
    """One `chat.completion.chunk`."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def stream_chunks(
    message: dict[str, Any],
    finish_reason: str,
    usage: dict[str, int] | None,
    *,
    model: str,
    completion_id: str,
    sent: str = "",
    with_role: bool = True,
    created: int | None = None,
) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a finished reply, in order: the role (unless
    already sent), the content not yet `sent` as deltas, one chunk per tool call, the finish.

    With `usage` (stream_options.include_usage), a last chunk with empty choices
    carries it, as OpenAI does.
    """
    created = int(time.time()) if created is None else created

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return stream_chunk(delta, finish, model=model, completion_id=completion_id, created=created)

    chunks = [chunk({"role": "assistant", "content": ""})] if with_role else []
    remainder = rest(sent, message.get("content") or "")
    if remainder:
        chunks.append(chunk({"content": remainder}))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function", {})
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call.get("id"),
                            "type": "function",
                            "function": {
                                "name": function.get("name"),
                                "arguments": function.get("arguments", ""),
                            },
                        }
                    ]
                }
            )
        )
    chunks.append(chunk({}, finish_reason))
    if usage is not None:
        chunks.append(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": dict(usage),
            }
        )
    return chunks


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_lines(chunks: list[dict[str, Any]]) -> list[str]:
    """Server-sent events for the chunks, ending with `data: [DONE]`."""
    return [sse(c) for c in chunks] + [SSE_DONE]


def models_response(created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": MODEL_NAME, "object": "model", "created": created, "owned_by": "ajet"}],
    }


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out
