"""One episode's chat sessions: every LLM call of the episode goes through here.

`EpisodeSession.chat` is the single path from an agent's messages to the engine and
back: the tracker builds the prompt ids (extending earlier calls token for token),
the per-call budget caps the completion length, the engine samples, the chat format
parses tool calls, and the call is recorded as an `LLMCall`. The `ModelTuner`
(AgentScope) and the OpenAI-compatible `Gateway` are thin shells around it.

Which model serves a call is the role's (`model=` of the engine, ajet/engine/served_models.py): a
default model registered for it ("initial", a checkpoint directory: `use_default_model`), else
the role's own LoRA adapter when it is trainable and the engine has one by its name
(`model.lora.per_role`), else the policy.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.context.budget import call_budget, model_window
from ajet.context.types import LLMCall
from ajet.engine.base import Completion, InferenceEngine, SamplingParams
from ajet.engine.chat import chosen_function, tool_choice_prefix
from ajet.engine.grammar import json_grammar, tool_call_grammar
from ajet.engine.requests import EngineBusyError
from ajet.engine.sampling import MAX_TOP_LOGPROBS, has_penalties, policy_temperature
from ajet.errors import InfrastructureError
from ajet.faults import fault_point
from ajet.tuner.streaming import TextStream, completion_text

log = logging.getLogger(__name__)
_WARNED_NO_GRAMMAR: set[str] = set()

# Limits on what a request may override (the rollout config gives the defaults).
_MAX_TEMPERATURE = 2.0


class SessionError(Exception):
    """Base class for errors a chat call reports to the agent."""


class SessionClosedError(SessionError):
    """The episode has ended; its model and keys are dead."""


class InvalidRequestError(SessionError, ValueError):
    """A request parameter is unknown, unsupported or out of range."""


class ContextBudgetError(SessionError, ValueError):
    """The prompt alone exceeds the per-call / model-window budget."""


class CallLimitError(SessionError):
    """The episode has made `rollout.max_calls_per_episode` calls; no more are served."""


class EngineBusy(SessionError):
    """The engine's waiting queue is full (`rollout.max_waiting_requests`); retry later."""


class ChatFormatLike(Protocol):
    """What the session needs from `ajet.engine.chat.ChatFormat`."""

    eos_token_ids: set[int]
    max_token_chars: int  # no token decodes to more characters than this

    def decode(self, token_ids: list[int]) -> str: ...

    def parse_completion(self, text: str) -> Any: ...

    def to_openai_message(self, parsed: Any) -> dict: ...


class TrackerLike(Protocol):
    """What the session needs from `ajet.context.tracker.ContextTracker`."""

    def build_prompt(
        self, role: str, messages: list[dict], tools: list[dict] | None, reply_prefix: str = ""
    ) -> list[int]: ...

    def record(self, call: LLMCall) -> None: ...


@dataclass
class ChatResult:
    """What one chat call returns: the OpenAI-style reply plus its record."""

    message: dict[str, Any]  # {"role": "assistant", "content": ..., "tool_calls": [...]}
    finish_reason: str  # "stop" | "length" | "tool_calls"
    usage: dict[str, int]  # prompt_tokens, completion_tokens, total_tokens
    call: LLMCall
    text: str  # the decoded completion as generated (tool-call markup included)
    malformed_tool_call: bool = False
    capped: bool = False  # max_tokens was lowered to fit the budget
    # Per completion token, with top_logprobs: the most likely tokens as (id, logprob) (not recorded)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


@dataclass
class SessionCounters:
    calls: int = 0
    malformed_tool_calls: int = 0
    repaired_tool_calls: int = 0
    capped_calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    per_role_calls: dict[str, int] = field(default_factory=dict)


def resolve_sampling(rollout: RolloutConfig, overrides: dict[str, Any]) -> SamplingParams:
    """The rollout defaults with a request's overrides, validated (pure).

    Accepted keys: temperature, top_p, top_k, max_tokens (alias max_completion_tokens),
    stop (str or list), seed, n (only 1), frequency_penalty and presence_penalty ([-2, 2]),
    logit_bias ({token id (int or its string): bias in [-100, 100]}), top_logprobs ([0, 20]).
    `None` values mean "use the default".
    `logprob_temperature` is the rollout temperature (1.0 when greedy), whatever the
    request's temperature, so old logprobs match the trainer's recomputation.
    """
    params = SamplingParams(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_tokens=rollout.max_tokens,
    )
    values = {k: v for k, v in overrides.items() if v is not None}
    if "max_completion_tokens" in values:
        values.setdefault("max_tokens", values.pop("max_completion_tokens"))
    unknown = set(values) - {"temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "n",
                             "frequency_penalty", "presence_penalty", "logit_bias", "top_logprobs"}
    if unknown:
        raise InvalidRequestError(
            f"unsupported sampling parameter(s) {sorted(unknown)}; supported: temperature, "
            "top_p, top_k, max_tokens, stop, seed, frequency_penalty, presence_penalty, logit_bias, "
            "top_logprobs"
        )
    if "n" in values and values["n"] != 1:
        raise InvalidRequestError(
            f"n={values['n']} is not supported: ask for one completion per call (n=1)"
        )
    if "temperature" in values:
        params.temperature = _number("temperature", values["temperature"], 0.0, _MAX_TEMPERATURE)
    if "top_p" in values:
        params.top_p = _number("top_p", values["top_p"], 0.0, 1.0)
        if params.top_p == 0.0:
            raise InvalidRequestError("top_p must be in (0, 1]")
    if "top_k" in values:
        params.top_k = int(_number("top_k", values["top_k"], 0, float("inf"), integer=True))
    if "max_tokens" in values:
        params.max_tokens = int(
            _number("max_tokens", values["max_tokens"], 1, float("inf"), integer=True)
        )
    if "seed" in values:
        params.seed = int(_number("seed", values["seed"], -(2**63), 2**63 - 1, integer=True))
    if "stop" in values:
        params.stop = _stop_list(values["stop"])
    for name in ("frequency_penalty", "presence_penalty"):
        if name in values:
            setattr(params, name, float(_number(name, values[name], -2.0, 2.0)))
    if "logit_bias" in values:
        params.logit_bias = _logit_bias(values["logit_bias"])
    if "top_logprobs" in values:
        params.top_logprobs = int(_number("top_logprobs", values["top_logprobs"], 0, MAX_TOP_LOGPROBS, integer=True))
    # Logprobs are always computed at the rollout temperature, the one the trainer
    # recomputes them at, even when a request samples at its own temperature.
    params.logprob_temperature = policy_temperature(rollout.temperature)
    return params


def call_seed(seed: int, episode_id: str, call: int) -> int:
    """The sampling seed of call `call` of `episode_id` under `rollout.seed` (stable across
    processes, unlike hash())."""
    digest = hashlib.sha256(f"{seed}/{episode_id}/{call}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _number(name: str, value: Any, low: float, high: float, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidRequestError(f"{name}={value} is out of range [{low}, {high}]")
    return value


def _logit_bias(bias: Any) -> dict[int, float]:
    """OpenAI's `logit_bias`: token ids (JSON keys are strings) to biases in [-100, 100]."""
    if not isinstance(bias, dict):
        raise InvalidRequestError(f"logit_bias must be an object of token id -> bias, got {bias!r}"[:200])
    out: dict[int, float] = {}
    for key, value in bias.items():
        token = str(key).strip()
        if not token.isdigit():
            raise InvalidRequestError(f"logit_bias: {key!r} is not a token id (a non-negative integer)"[:200])
        out[int(token)] = float(_number(f"logit_bias[{token}]", value, -100.0, 100.0))
    return out


def _stop_list(stop: Any) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequestError(
            f"stop must be a non-empty string or a list of them, got {stop!r}"
        )
    return list(stops)


class EpisodeSession:
    """All chat calls of one episode. Thread-safe; `close()` makes it refuse new calls."""

    def __init__(
        self,
        episode_id: str,
        engine: InferenceEngine,
        chat: ChatFormatLike,
        tracker: TrackerLike,
        rollout: RolloutConfig,
        context: ContextConfig,
        trainable_targets: set[str] | None,
        model_max_len: int,
    ) -> None:
        self.episode_id = episode_id
        self.engine = engine
        self.chat_format = chat
        self.tracker = tracker
        self.rollout = rollout
        self.context = context
        # None or empty = every role is trainable.
        self.trainable_targets = set(trainable_targets) if trainable_targets else None
        self.model_max_len = model_max_len
        self.counters = SessionCounters()
        self._calls_begun = 0  # against rollout.max_calls_per_episode
        self._lock = threading.Lock()
        self._refusal_logged = False  # the first refused call of the episode is logged
        self._closed = False
        # The policy's adapters by name (per_role: one per trainable role); none on other engines.
        self._adapters = frozenset(getattr(engine, "adapters", ()) or ())
        self._default_models: dict[str, str] = {}  # role -> "initial" or a checkpoint directory

    # -- state ---------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Mark the session dead: later (and still running) calls raise SessionClosedError."""
        with self._lock:
            self._closed = True

    def is_trainable(self, role: str) -> bool:
        return self.trainable_targets is None or role in self.trainable_targets

    def use_default_model(self, role: str, model: str) -> None:
        """Serve the calls of `role` (not trainable) with a model of the engine: "initial" (the
        frozen initial weights) or a local checkpoint directory. Checked now (config files
        only): ValueError naming the role and the fix."""
        if not self.engine.supports_models:
            raise ValueError(
                f"role {role!r}: default_model={model!r} is served by the debug backbone's engine only; "
                f"this run's engine ({type(self.engine).__name__}) serves the policy alone. Pass an AgentScope "
                "chat model as default_model (e.g. an OpenAIChatModel on another server), or train with "
                "--backbone=debug")
        try:
            self.engine.check_model(model)
        except ValueError as err:
            raise ValueError(f"role {role!r}: default_model={model!r}: {err}") from None
        with self._lock:
            self._default_models[role] = model

    def model_for(self, role: str) -> str | None:
        """The engine's `model=` for a call of `role` (None: the policy)."""
        with self._lock:
            default = self._default_models.get(role)
        if default is not None:
            return default
        return role if role in self._adapters and self.is_trainable(role) else None

    def stats(self) -> dict[str, float]:
        with self._lock:
            c = self.counters
            return {
                "tuner/calls": c.calls,
                "tuner/malformed_tool_calls": c.malformed_tool_calls,
                "tuner/repaired_tool_calls": c.repaired_tool_calls,
                "tuner/capped_calls": c.capped_calls,
                "tuner/failed_calls": c.failed_calls,
                "tuner/prompt_tokens": c.prompt_tokens,
                "tuner/completion_tokens": c.completion_tokens,
            }

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(
                f"episode {self.episode_id} has ended; its model can no longer be called "
                "(keep every LLM call inside Workflow.execute)"
            )

    # -- the call --------------------------------------------------------------
    async def chat(
        self,
        role: str,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_choice: str | dict | None = None,
        response_format: dict | None = None,
        on_text: Callable[[str], None] | None = None,
        **sampling_overrides: Any,
    ) -> ChatResult:
        """One chat call: prompt through the tracker, budget, sample, parse, record.

        `tool_choice="none"` leaves the reply unparsed (tool-call markup stays text);
        "required" / "any" / a function name start the reply with the tool-call markup
        (`ajet.engine.chat.tool_choice_prefix`): the model writes the rest. The forced start
        is part of the prompt, so it is context, not trained. With `rollout.tool_call_grammar`
        ("forced", or "all" for calls the model starts itself too) and an engine that
        supports grammars, a forced call is instead decoded under the
        tool's JSON schema (`ajet.engine.grammar`): it always parses, and the tokens the
        grammar forces are context. `response_format` (OpenAI's `json_schema` /
        `json_object`) constrains the reply to JSON the same way.
        `on_text` receives content deltas while the reply is generated, when the engine can
        stream and no tool call is forced (`ajet.tuner.streaming`).
        """
        self._check_open()
        self._calls_begun += 1
        if self._calls_begun > self.rollout.max_calls_per_episode:
            message = (
                f"episode {self.episode_id} has made rollout.max_calls_per_episode="
                f"{self.rollout.max_calls_per_episode} LLM calls; no more are served (raise the setting for "
                "agents that need more turns, or end the episode)")
            self._count_failure(message)
            raise CallLimitError(message)
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("messages must be a non-empty list of message dicts")
        params = resolve_sampling(self.rollout, sampling_overrides)
        if params.seed is None and self.rollout.seed is not None:
            params.seed = call_seed(self.rollout.seed, self.episode_id, self._calls_begun)
        tools = tools or None
        tool_choice = self._first_call_tool_choice(role, tools, tool_choice)

        try:
            prefix = tool_choice_prefix(tool_choice, tools)
            params.grammar = self._grammar(tool_choice, tools, response_format)
        except ValueError as err:
            raise InvalidRequestError(str(err)) from None
        if params.grammar is not None:
            prefix = ""  # the grammar forces the call's markup itself (as context)
        self._check_penalties(params)
        self._check_prompt_chars(messages)
        # Rendering and tokenising a long prompt takes CPU time: off the loop that runs the
        # episodes (the tracker is thread-safe), so one long prompt stalls only its own call.
        prompt_ids = await asyncio.to_thread(self.tracker.build_prompt, role, messages, tools, prefix)
        requested = params.max_tokens
        params.max_tokens = self._budget(len(prompt_ids), requested)
        capped = params.max_tokens < requested
        options: dict[str, Any] = {}  # what the engine takes beyond the prompt and params
        if (on_text is not None and not prefix and params.grammar is None
                and self.engine.supports_streaming):

            options["on_token"] = TextStream(self.chat_format, params.stop, on_text).push
        model = self.model_for(role)
        if model is not None:  # only engines with `supports_models` get here with one
            options["model"] = model
        try:
            completions = await self.engine.generate(list(prompt_ids), params, **options)
            fault_point("episode")
        except ValueError as err:  # the engine rejected this request (e.g. prompt too long)
            self._count_failure(f"episode {self.episode_id}: the engine refused a call: {err}")
            raise
        except EngineBusyError as err:
            self._count_failure()
            raise EngineBusy(str(err)) from err
        except Exception as err:  # noqa: BLE001 - re-raised as an infrastructure failure
            self._count_failure()
            raise InfrastructureError(
                f"episode {self.episode_id}: the inference engine failed: {type(err).__name__}: {err}"
            ) from err
        completion = _single(completions)
        return self._finish(
            role, messages, tools, tool_choice, params, prompt_ids, completion, capped, prefix
        )

    def _grammar(self, tool_choice: str | dict | None, tools: list[dict] | None,
                 response_format: dict | None) -> Any:
        """The grammar a call decodes under, or None (see `chat`)."""
        kind = (response_format or {}).get("type") if isinstance(response_format, dict) else None
        if response_format is not None and kind not in ("json_schema", "json_object", "text"):
            raise InvalidRequestError(
                f"response_format={response_format!r}: type must be 'json_schema', 'json_object' or 'text'"
            )
        mode = self.rollout.tool_call_grammar
        auto = tool_choice in (None, "auto")
        calls = bool(tools) and tool_choice != "none" and (mode == "all" or mode == "forced" and not auto)
        if not (calls or kind in ("json_schema", "json_object")):
            return None
        if not self.engine.supports_grammar:
            engine = type(self.engine).__name__
            if engine not in _WARNED_NO_GRAMMAR:  # once per engine type, not per episode
                _WARNED_NO_GRAMMAR.add(engine)
                log.warning("the inference engine %s cannot constrain decoding to a grammar; "
                            "forced tool calls and response_format are decoded freely", engine)
            return None
        if kind == "json_schema":
            spec = response_format.get("json_schema") or {}
            if not isinstance(spec, dict):
                raise InvalidRequestError("response_format.json_schema must be an object with a 'schema'")
            return json_grammar(spec.get("schema"), strict=bool(spec.get("strict")))
        if kind == "json_object":
            return json_grammar(None)
        if auto:
            return tool_call_grammar(tools or [], triggered=True)
        if tool_choice in ("required", "any"):
            return tool_call_grammar(tools or [])
        return tool_call_grammar(tools or [], chosen_function(tool_choice))

    def _first_call_tool_choice(
        self, role: str, tools: list[dict] | None, tool_choice: str | dict | None
    ) -> str | dict | None:
        """`rollout.first_call_tool_choice` on a role's first call that offers tools and asks
        for no particular choice; otherwise the request's own `tool_choice`."""
        forced = self.rollout.first_call_tool_choice
        if not forced or not tools or tool_choice not in (None, "auto"):
            return tool_choice
        with self._lock:
            first = self.counters.per_role_calls.get(role, 0) == 0
        return forced if first else tool_choice

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text (`logprobs` of the chat-completions protocol)."""
        return [self.chat_format.decode([i]) for i in ids]

    def _close_forced_call(self, text: str, parsed: Any) -> Any:
        """A forced tool call the model ended (EOS, stop) without its closing markup is
        closed: `</tool_call>`, with the one or two `}` still open after the arguments. What
        was sampled is recorded unchanged."""
        import json

        if "</tool_call>" in text or "<tool_call>" not in text:
            return parsed
        body = text[text.rindex("<tool_call>") + len("<tool_call>"):].rstrip()
        for braces in ("", "}", "}}", '"}', '"}}'):
            try:  # checked quietly first: only a closing that parses is handed to the parser
                json.loads(body + braces)
            except json.JSONDecodeError:
                continue
            closed = self.chat_format.parse_completion(text.rstrip() + braces + "\n</tool_call>")
            if closed.malformed_tool_call:
                return parsed
            what = f"closed the forced call with {braces + '</tool_call>'!r}"
            if closed.repaired:
                closed.repaired[-1] = f"{what}; {closed.repaired[-1]}"
            else:
                closed.repaired.append(what)
            log.debug("episode %s: repaired tool call (%s): %r", self.episode_id, what, text)
            return closed
        return parsed

    def _count_failure(self, refusal: str | None = None) -> None:
        """Count a failed call; the episode's first refused call is also logged with its reason,
        since a client (a CLI harness most of all) may retry it quietly or swallow the error."""
        with self._lock:
            self.counters.failed_calls += 1
            first = refusal is not None and not self._refusal_logged
            if first:
                self._refusal_logged = True
        if first:
            log.warning("%s (the client got it as an error; this episode's later refused calls are "
                        "counted in tuner/failed_calls, not logged)", refusal)

    def _check_penalties(self, params: SamplingParams) -> None:
        """Penalties and logit_bias need an engine that applies them (and records the adjusted
        logprobs), top_logprobs one that returns alternatives; a bias names tokens of the
        model's vocabulary."""
        if params.top_logprobs and not self.engine.supports_top_logprobs:
            raise InvalidRequestError("top_logprobs: this backbone's engine returns only the sampled token's "
                                      "logprob (the debug backbone's returns alternatives); send 0 or leave it out")
        if not has_penalties(params):
            return
        if not self.engine.supports_penalties:
            field = next(name for name in ("frequency_penalty", "presence_penalty", "logit_bias")
                         if getattr(params, name))
            raise InvalidRequestError(f"{field}: this backbone's engine does not apply penalties or logit_bias "
                                      "(the debug backbone's does); leave it out")
        vocab = self.chat_format.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise InvalidRequestError(f"logit_bias: token id {max(params.logit_bias)} is not in the model's "
                                      f"vocabulary of {vocab} tokens")

    def _check_prompt_chars(self, messages: list[dict]) -> None:
        """Refuse a prompt that cannot fit the model window, judged by its length in
        characters, before it is rendered or tokenised (a 10 MB question took 74 s to
        tokenise). Assistant turns are not counted: some templates drop parts of them
        (e.g. earlier reasoning), and the count must stay a lower bound on the prompt."""
        window = model_window(self.context, self.model_max_len)
        if not window:
            return
        chars = sum(
            _text_chars(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") != "assistant"
        )
        at_least = -(-chars // max(1, self.chat_format.max_token_chars))
        if at_least >= window:
            message = (
                f"episode {self.episode_id}: the prompt has {chars} characters of messages, so at "
                f"least {at_least} tokens, which leaves no room for a completion within the model "
                f"window ({window} tokens); refused before tokenising. Shorten the conversation "
                "(summarise or drop old turns, cut long documents) or raise context.max_model_len."
            )
            self._count_failure(message)
            raise ContextBudgetError(message)

    def _budget(self, prompt_len: int, requested: int) -> int:
        allowed = call_budget(prompt_len, requested, self.context, self.model_max_len)
        if allowed <= 0:
            message = (
                f"episode {self.episode_id}: the prompt is {prompt_len} tokens, which leaves no room "
                f"for a completion within the model window ({self.model_max_len} tokens). Shorten the "
                "conversation (summarise or drop old turns) or raise context.max_model_len."
            )
            self._count_failure(message)
            raise ContextBudgetError(message)
        return min(allowed, requested)

    def _finish(
        self,
        role: str,
        messages: list[dict],
        tools: list[dict] | None,
        tool_choice: str | dict | None,
        params: SamplingParams,
        prompt_ids: list[int],
        completion: Completion,
        capped: bool,
        prefix: str = "",
    ) -> ChatResult:
        text = prefix + completion_text(self.chat_format, completion.token_ids, params.stop)
        malformed, repaired, cut = False, 0, False
        if tool_choice == "none":
            message: dict[str, Any] = {"role": "assistant", "content": text}
        else:
            parsed = self.chat_format.parse_completion(text)
            if (prefix or params.grammar is not None) and parsed.malformed_tool_call:
                parsed = self._close_forced_call(text, parsed)
            malformed = bool(parsed.malformed_tool_call)
            repaired = len(parsed.repaired)
            message = self.chat_format.to_openai_message(parsed)
            forced = bool(prefix) or params.grammar is not None
            if forced and completion.finish_reason == "length":
                # A forced call cut at max_tokens says so (finish "length"), in the protocol's own
                # shape: closed where its arguments so far parse once closed, else the call so far
                # (its name, its arguments as written), never ajet's markup as content.
                cut = True
                if malformed:
                    message = cut_tool_call(text)
        finish_reason = "tool_calls" if message.get("tool_calls") and not cut else completion.finish_reason
        call = LLMCall(
            role=role,
            prompt_ids=list(prompt_ids),
            completion_ids=list(completion.token_ids),
            completion_logprobs=list(completion.logprobs),
            completion_forced=list(completion.forced),
            finish_reason=finish_reason,
            policy_version=completion.policy_version,
            messages=[dict(m) for m in messages],
            tools=tools,
            response_message=message,
            trainable=self.is_trainable(role),
            repaired_tool_calls=repaired,
            malformed_tool_call=malformed,
        )
        with self._lock:
            # A call still running when the episode ended is discarded, not recorded.
            self._check_open()
            self.tracker.record(call)
            c = self.counters
            c.calls += 1
            c.per_role_calls[role] = c.per_role_calls.get(role, 0) + 1
            c.malformed_tool_calls += int(malformed)
            c.repaired_tool_calls += repaired
            c.capped_calls += int(capped)
            c.prompt_tokens += len(prompt_ids)
            c.completion_tokens += len(completion.token_ids)
        if capped:
            log.debug(
                "episode %s: max_tokens capped to %d by the call budget",
                self.episode_id,
                params.max_tokens,
            )
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion.token_ids),
            "total_tokens": len(prompt_ids) + len(completion.token_ids),
        }
        return ChatResult(message, finish_reason, usage, call, text, malformed, capped, completion.top_logprobs)


def cut_tool_call(text: str) -> dict[str, Any]:
    """The assistant message of a tool call cut at max_tokens, as OpenAI returns one: no content,
    the function's name (when it was written) and its arguments so far, as a string."""
    import re
    import uuid

    body = text[text.rindex("<tool_call>") + len("<tool_call>"):] if "<tool_call>" in text else text
    name = re.search(r'"name"\s*:\s*"([^"]*)"', body)
    arguments = re.search(r'"arguments"\s*:\s*(.*)\Z', body, re.S)
    call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name.group(1) if name else "", "arguments": arguments.group(1) if arguments else ""}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _text_chars(content: Any) -> int:
    """Characters of a message's text; what is not text counts 0 (the renderer refuses it)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(b) if isinstance(b, str)
            else len(b.get("text") or "") if isinstance(b, dict) and isinstance(b.get("text"), str)
            else 0
            for b in content
        )
    return 0


def _single(completions: list[Completion]) -> Completion:
    if len(completions) != 1:
        raise RuntimeError(f"the engine returned {len(completions)} completions for n=1")
    return completions[0]
