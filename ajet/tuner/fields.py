"""Every field of a chat-completions request body, declared once: what the gateway does with it.

A `GatewayField` names the field and gives its type and bounds, its status (honoured, no effect,
refused), the engine feature it needs (`EngineFeatures`' `supports_*`), and its row of the table in
docs/gateway.md. The rest is derived from `FIELDS`: the request model (`ajet.tuner.openai_compat`),
the fields refused by name (`refused_field`), the protocol's field names (`PROTOCOL_FIELDS`), the
sampling fields a chat call takes and their checks (`ajet.tuner.request_sampling`), the engine
checks (`missing_feature`) and the docs' table (`markdown_table`; scripts/tools/docs_gateway.py
writes it, and a test checks the page holds it). A field added here without its docs fails that test.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ajet.engine.base import InferenceEngine
from ajet.engine.sampling import MAX_TOP_LOGPROBS

MODEL_NAME = "ajet-policy"
REQUIRED: Any = ...  # `GatewayField.default` of a field the body must have


class Status(Enum):
    HONOURED = "honoured"
    NO_EFFECT = "no effect"  # accepted; about billing, storage and caching on OpenAI's side
    REFUSED = "refused"  # a 400 naming the field (`error.param`), code `unsupported_parameter`


@dataclass(frozen=True)
class Bounds:
    """The closed range [low, high] a number must be in; `low_open`: low itself is out."""

    low: float
    high: float = math.inf
    low_open: bool = False

    def check(self, name: str, value: float) -> None:
        above = value > self.low if self.low_open else value >= self.low
        if not (above and value <= self.high):
            raise ValueError(f"{name}={value} is out of range {self}")

    def json_schema(self) -> dict[str, float]:
        out = {"exclusiveMinimum" if self.low_open else "minimum": self.low}
        return out | ({"maximum": self.high} if math.isfinite(self.high) else {})

    def __str__(self) -> str:
        def num(x: float) -> str:
            return "inf" if math.isinf(x) else f"{x:g}"

        return f"{'(' if self.low_open else '['}{num(self.low)}, {num(self.high)}]"


# A value's check and conversion (to what `SamplingParams` holds): `parse(name, value, bounds)`.
Parse = Callable[[str, Any, "Bounds | None"], Any]


def number(name: str, value: Any, bounds: Bounds | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}"[:200])
    if bounds is not None:
        bounds.check(name, value)
    return float(value)


def integer(name: str, value: Any, bounds: Bounds | None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be an integer, got {value!r}"[:200])
    if not float(value).is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if bounds is not None:
        bounds.check(name, value)
    return int(value)


def top_k(name: str, value: Any, bounds: Bounds | None) -> int:
    """vLLM's top_k: -1 (its "off") is 0, ajet's."""
    k = integer(name, value, bounds)
    return 0 if k == -1 else k


def stop_list(name: str, value: Any, bounds: Bounds | None) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"{name} must be a non-empty string or a list of them, got {value!r}"[:200])
    return list(stops)


def token_biases(name: str, value: Any, bounds: Bounds | None) -> dict[int, float]:
    """OpenAI's `logit_bias`: token ids (JSON keys are strings) to biases within `bounds`."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object of token id -> bias, got {value!r}"[:200])
    out: dict[int, float] = {}
    for key, bias in value.items():
        token = str(key).strip()
        if not token.isdigit():
            raise ValueError(f"{name}: {key!r} is not a token id (a non-negative integer)"[:200])
        out[int(token)] = number(f"{name}[{token}]", bias, bounds)
    return out


def message_list(name: str, value: Any, bounds: Bounds | None) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{name} must be a non-empty list of message dicts")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"{name}[{i}] has no 'role'")
    return value


@dataclass(frozen=True)
class GatewayField:
    """One field of the protocol. `doc` is its row's text in docs/gateway.md: fields declared one
    after another with the same text share a row."""

    name: str
    status: Status
    doc: str
    type: Any = None  # honoured: the Python type the request model gives it
    default: Any = None
    bounds: Bounds | None = None  # a number's range; logit_bias: each bias's
    parse: Parse | None = None  # checks a value (and converts it for SamplingParams)
    sampling: bool = False  # a SamplingParams field of the same name (`ajet.tuner.request_sampling`)
    # The engine feature a value other than the field's "off" (None, 0, {}) needs, and what the
    # refusal says without it.
    needs: Callable[[InferenceEngine], bool] | None = None
    without: str = ""
    honoured_values: tuple[Any, ...] | None = None  # only these are honoured; others are refused
    why: str = ""  # refused (or a value outside honoured_values): the message's reason

    def check(self, value: Any) -> Any:
        """`value` checked and converted (ValueError naming the field); None stays None."""
        if value is None or self.parse is None:
            return value
        return self.parse(self.name, value, self.bounds)

    def json_schema(self) -> dict[str, Any] | None:
        """What the request model's JSON schema adds: the bounds (of each bias, for logit_bias)."""
        if self.bounds is None:
            return None
        return {"additionalProperties": self.bounds.json_schema()} if self.parse is token_biases \
            else dict(self.bounds.json_schema())


# The texts of rows that several fields share.
_MODEL = "honoured; `model` may name a role's model in multi-agent runs (docs/multi_agent.md)"
_TOOLS = ("honoured: hermes `<tool_call>` markup; `required`, `{\"type\": \"function\", ...}` or a name forces a "
          "call (its forced start is prompt, never trained). A tool sent with `\"strict\": true` has its arguments "
          "decoded under its schema, whether the call was forced or the model started it (recorded logprobs "
          "exact, as for forced calls; an engine that cannot constrain decoding decodes it freely and logs so "
          "once). With `response_format`, a forced choice wins (the reply is the call, as in vLLM); with "
          "`auto` the reply is a call or an answer in the format")
_SAMPLING = "honoured"
_MAX_TOKENS = ("honoured, capped by `context.max_call_tokens` and the model window; when both are sent, "
               "`max_completion_tokens` wins (as vLLM and SGLang)")
_STREAM = "honoured: text as it is written, tool calls when complete, `include_usage`"
_PENALTIES = (
    "honoured on the debug backbone's engine, as OpenAI defines them: each token's logit, minus "
    "`frequency_penalty` × its count in the completion so far and `presence_penalty` once it occurs, plus "
    "`logit_bias[token id]` (keys are token ids; a bias of ±100 forces or bans the token). The recorded "
    "logprob (and `logprobs`) is that of this adjusted distribution, the one the token was sampled from. The "
    "trainer recomputes the policy's own, unadjusted logprob, so the update's ratio p_policy / p_sampled is an "
    "importance weight from the sampling distribution to the policy (clipped by PPO's range; "
    "`algorithm.tis_cap` truncates it): a heavily biased token moves the policy little. Ranges: penalties "
    "[-2, 2], biases [-100, 100], ids in the vocabulary (else a 400). The GPU backbones' vLLM engines refuse "
    "them with a 400 naming the field")
_NO_PENALTIES = "this backbone's engine does not apply penalties or logit_bias (the debug backbone's does); leave it out"
_NO_EFFECT = "no effect (billing, storage and caching on OpenAI's side)"


def _penalties(engine: InferenceEngine) -> bool:
    return engine.supports_penalties


def _refused(name: str, why: str) -> GatewayField:
    return GatewayField(name, Status.REFUSED, "refused", why=why)


H = Status.HONOURED
FIELDS: tuple[GatewayField, ...] = (
    GatewayField("model", H, _MODEL, str, MODEL_NAME),
    GatewayField("messages", H, _MODEL, list[dict[str, Any]], REQUIRED, parse=message_list),
    GatewayField("tools", H, _TOOLS, list[dict[str, Any]] | None),
    GatewayField("tool_choice", H, _TOOLS, str | dict[str, Any] | None),
    GatewayField("response_format", H, "honoured: `json_schema` / `json_object` constrain the reply (docs/grammar.md); "
                 "with tools see above. With tools the model may call (`auto`), an engine that cannot constrain "
                 "decoding refuses it with a 400 naming the field", dict[str, Any] | None),
    GatewayField("temperature", H, _SAMPLING, float | None, bounds=Bounds(0.0, 2.0), parse=number, sampling=True),
    GatewayField("top_p", H, _SAMPLING, float | None, bounds=Bounds(0.0, 1.0, low_open=True), parse=number,
                 sampling=True),
    GatewayField("top_k", H, _SAMPLING, int | None, bounds=Bounds(-1), parse=top_k, sampling=True),  # -1 or 0: off
    GatewayField("seed", H, _SAMPLING, int | None, bounds=Bounds(-(2**63), 2**63 - 1), parse=integer, sampling=True),
    GatewayField("stop", H, _SAMPLING, str | list[str] | None, parse=stop_list, sampling=True),
    GatewayField("max_tokens", H, _MAX_TOKENS, int | None, bounds=Bounds(1), parse=integer, sampling=True),
    GatewayField("max_completion_tokens", H, _MAX_TOKENS, int | None, bounds=Bounds(1), parse=integer, sampling=True),
    GatewayField("stream", H, _STREAM, bool, False),
    GatewayField("stream_options", H, _STREAM, dict[str, Any] | None),
    GatewayField("logprobs", H, "honoured: `choices[0].logprobs.content` has each completion token's recorded "
                 "logprob, the one the trainer uses (the policy at `rollout.temperature`, whatever the request's "
                 "temperature). Not with `stream: true` (400)", bool, False),
    GatewayField("top_logprobs", H, "honoured with `logprobs: true` (else a 400, as OpenAI and vLLM), 0 to 20: each "
                 "token's entry lists the most likely tokens of the distribution its logprob is recorded in "
                 "(penalties and `logit_bias` applied, a grammar's mask not), most likely first; the sampled "
                 "token's own entry, where it is among them, equals its `logprob`. Forced tokens (a grammar's "
                 "markup) have their entries too. The GPU backbones' vLLM engines refuse values above 0 with a "
                 "400 naming the field", int | None, bounds=Bounds(0, MAX_TOP_LOGPROBS), parse=integer,
                 sampling=True, needs=lambda engine: engine.supports_top_logprobs,
                 without="this backbone's engine returns only the sampled token's logprob (the debug backbone's "
                 "returns alternatives); send 0 or leave it out"),
    GatewayField("n", H, "`1` honoured; more is refused: each completion is a call of the episode, recorded as its "
                 "own; make n calls (they share the prompt's prefix cache)", int, 1, parse=integer, sampling=True,
                 honoured_values=(1,), why="each completion is an episode's own call; make n calls (they share "
                 "the prompt's prefix cache) or use n=1"),
    GatewayField("parallel_tool_calls", H, "honoured: `true` (the default): every call the model writes is returned "
                 "and trained; `false`: at most one call per reply, enforced by the grammar (an engine "
                 "that cannot constrain decoding refuses it with a 400 naming the field, when tools are offered)",
                 bool | None),
    GatewayField("frequency_penalty", H, _PENALTIES, float | None, bounds=Bounds(-2.0, 2.0), parse=number,
                 sampling=True, needs=_penalties, without=_NO_PENALTIES),
    GatewayField("presence_penalty", H, _PENALTIES, float | None, bounds=Bounds(-2.0, 2.0), parse=number,
                 sampling=True, needs=_penalties, without=_NO_PENALTIES),
    GatewayField("logit_bias", H, _PENALTIES, dict[str, float] | None, bounds=Bounds(-100.0, 100.0),
                 parse=token_biases, sampling=True, needs=_penalties, without=_NO_PENALTIES),
    *(GatewayField(name, Status.NO_EFFECT, _NO_EFFECT)
      for name in ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key")),
    _refused("audio", "audio output is not supported"),
    _refused("modalities", "only text output is supported"),
    _refused("prediction", "predicted outputs are not supported"),
    _refused("web_search_options", "web search is not supported"),
    _refused("functions", "the legacy `functions` field is not supported; send `tools`"),
    _refused("function_call", "the legacy `function_call` field is not supported; send `tool_choice`"),
    _refused("reasoning_effort", "the policy has no reasoning-effort setting"),
    _refused("verbosity", "the policy has no verbosity setting"),
)
BY_NAME = {f.name: f for f in FIELDS}
PROTOCOL_FIELDS = frozenset(BY_NAME)
SAMPLING_FIELDS = tuple(f for f in FIELDS if f.sampling)


def refused_field(payload: dict[str, Any]) -> tuple[str, str] | None:
    """(field, why) for the first field of a request body that ajet refuses, or None."""
    for spec in FIELDS:
        if spec.status is Status.REFUSED and payload.get(spec.name) is not None:
            return spec.name, f"{spec.name}: {spec.why}"
        if spec.honoured_values is not None and spec.name in payload:
            value = payload[spec.name]
            if not any(value == honoured for honoured in spec.honoured_values):
                return spec.name, f"{spec.name}={json.dumps(value)[:60]}: {spec.why}"
    return None


def missing_feature(engine: InferenceEngine, values: dict[str, Any]) -> tuple[str, str] | None:
    """(field, why) for the first of `values` (field -> value) that the engine lacks the feature
    for: a value other than the field's "off" (None, 0, {}) of a field that `needs` one."""
    for spec in FIELDS:
        if spec.needs is not None and values.get(spec.name) and not spec.needs(engine):
            return spec.name, f"{spec.name}: {spec.without}"
    return None


def markdown_table() -> str:
    """docs/gateway.md's table of the fields: one row per run of fields with the same text."""
    rows: list[tuple[list[str], str]] = []
    for spec in FIELDS:
        if rows and rows[-1][1] == spec.doc:
            rows[-1][0].append(spec.name)
        else:
            rows.append(([spec.name], spec.doc))
    lines = ["| field | status |", "|---|---|"]
    lines += [f"| {', '.join(f'`{n}`' for n in names)} | {doc} |" for names, doc in rows]
    return "\n".join(lines)
