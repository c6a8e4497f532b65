"""The OpenAI chat-completions wire format: the request model and response builders.

Pure functions over plain data so that the gateway only routes; what goes over the
wire is tested here without a server.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from ajet.tuner.fields import (
    FIELDS,
    MODEL_NAME,
    PROTOCOL_FIELDS,
    SAMPLING_FIELDS,
    GatewayField,
    Status,
    refused_field,
)
from ajet.tuner.streaming import rest

__all__ = ["MODEL_NAME", "PROTOCOL_FIELDS", "ChatCompletionRequest", "RequestBody", "refused_field"]

class RequestBody(BaseModel):
    """A validated chat-completions body: the honoured fields of `ajet.tuner.fields.FIELDS` (the
    model `ChatCompletionRequest` is built from them), each checked by its declaration; fields
    outside them are kept as extras, unread (`refused_field` decides on the refused ones first).
    `logprobs=true` returns each completion token's recorded logprob (the policy at
    rollout.temperature: what the trainer uses), with `top_logprobs` the most likely tokens of
    that same distribution."""

    model_config = ConfigDict(extra="allow")

    if TYPE_CHECKING:  # the declared fields, created at run time from FIELDS
        def __getattr__(self, name: str) -> Any: ...

    def sampling_overrides(self) -> dict[str, Any]:
        """The sampling fields (`EpisodeSession.chat`'s keyword arguments); top_logprobs only
        with logprobs."""
        values = {spec.name: getattr(self, spec.name) for spec in SAMPLING_FIELDS}
        if not self.logprobs:
            values["top_logprobs"] = None
        return values

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


def _model_field(spec: GatewayField) -> tuple[Any, Any]:
    """(annotation, pydantic Field) of a declared field: its checks run as pydantic's, so a bad
    value is the same error over HTTP as through `EpisodeSession.chat`."""
    def check(value: Any) -> Any:
        spec.check(value)
        return value

    annotation = Annotated[spec.type, AfterValidator(check)] if spec.parse is not None else spec.type
    return annotation, Field(spec.default, json_schema_extra=spec.json_schema())


_DECLARED: dict[str, Any] = {spec.name: _model_field(spec) for spec in FIELDS if spec.status is Status.HONOURED}
ChatCompletionRequest = create_model("ChatCompletionRequest", __base__=RequestBody, **_DECLARED)


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
