"""One episode's chat sessions: every LLM call of the episode goes through here.

`EpisodeSession.chat` is the single path from an agent's messages to the engine and
back: the tracker builds the prompt ids (extending earlier calls token for token),
the per-call budget caps the completion length, the engine samples, the chat format
parses tool calls, and the call is recorded as an `LLMCall`. The `ModelTuner`
(AgentScope) and the OpenAI-compatible `Gateway` are thin shells around it. What a request
may set is `ajet.tuner.request_sampling`'s (declared in `ajet.tuner.fields`), how the reply is
constrained `ajet.tuner.constraints`', and how its text becomes a message `ajet.tuner.replies`'.

Which model serves a call is the role's (`model=` of the engine, ajet/engine/served_models.py): a
default model registered for it ("initial", a checkpoint directory: `use_default_model`), else
the role's own LoRA adapter when it is trainable and the engine has one by its name
(`model.lora.per_role`), else the policy.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.context.budget import call_budget, model_window
from ajet.context.types import LLMCall
from ajet.engine.base import Completion, InferenceEngine, SamplingParams
from ajet.engine.requests import EngineBusyError
from ajet.errors import InfrastructureError
from ajet.faults import fault_point
from ajet.tuner.constraints import Decoding, decoding
from ajet.tuner.errors import (
    CallLimitError,
    ContextBudgetError,
    EngineBusy,
    InvalidRequestError,
    SessionClosedError,
    SessionError,
)
from ajet.tuner.replies import reply
from ajet.tuner.request_sampling import call_seed, check_engine_features, resolve_sampling
from ajet.tuner.streaming import TextStream, completion_text

__all__ = [  # the errors are part of this module's interface (they live in ajet.tuner.errors)
    "CallLimitError", "ChatResult", "ContextBudgetError", "EngineBusy", "EpisodeSession", "InvalidRequestError",
    "SessionClosedError", "SessionCounters", "SessionError", "resolve_sampling",
]

log = logging.getLogger(__name__)


class ChatFormatLike(Protocol):
    """What the session needs from `ajet.engine.chat.ChatFormat`."""

    eos_token_ids: set[int]
    max_token_chars: int  # no token decodes to more characters than this

    @property
    def vocab_size(self) -> int: ...

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
    refused_calls: int = 0  # failed calls the client got as an error with its reason (400, 429)
    refused_fields: dict[str, int] = field(default_factory=dict)  # of those, per field to blame


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
        self._refusal_logged = False  # the first refused call of the episode is logged, the rest counted
        self._closed = False
        # The policy's adapters by name (per_role: one per trainable role); none on other engines.
        self._adapters = frozenset(engine.adapters) if engine.supports_models else frozenset()
        self._default_models: dict[str, str] = {}  # role -> "initial" or a checkpoint directory

    # -- state ---------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Mark the session dead: later (and still running) calls raise SessionClosedError. When
        more than one call was refused, the log gets their count (the first was logged as it came)."""
        with self._lock:
            was_closed, self._closed = self._closed, True
            refused, fields = self.counters.refused_calls, dict(self.counters.refused_fields)
        if not was_closed and refused > 1:
            by_field = ", ".join(f"{name}: {count}" for name, count in sorted(fields.items()))
            log.warning("episode %s: %d calls were refused in all%s (the client got each as an error)",
                        self.episode_id, refused, f" ({by_field})" if by_field else "")

    def refusals(self) -> dict[str, int]:
        """How many calls were refused for each field (`gateway/refused/<field>`)."""
        with self._lock:
            return dict(self.counters.refused_fields)

    def refuse(self, message: str, field: str | None = None) -> None:
        """Count (and, the episode's first, log) a call the gateway refused before it reached
        `chat`: a body that does not parse, a refused or invalid field."""
        self._count_failure(f"episode {self.episode_id}: refused a call: {message}", field)

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
                **{f"gateway/refused/{name}": count for name, count in c.refused_fields.items()},
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
        parallel_tool_calls: bool | None = None,
        on_text: Callable[[str], None] | None = None,
        **sampling_overrides: Any,
    ) -> ChatResult:
        """One chat call: prompt through the tracker, budget, sample, parse, record.

        `tool_choice="none"` leaves the reply unparsed (tool-call markup stays text);
        "required" / "any" / a function name force a tool call; `response_format`,
        `parallel_tool_calls=False` and tools sent with `strict: true` constrain the reply
        (`ajet.tuner.constraints`). A refused request (InvalidRequestError) is counted by the
        field to blame. `on_text` receives content deltas while the reply is generated, when the
        engine can stream and no tool call is forced (`ajet.tuner.streaming`).
        """
        self._begin_call()
        tools = tools or None
        tool_choice = self._first_call_tool_choice(role, tools, tool_choice)
        try:
            if not isinstance(messages, list) or not messages:
                raise InvalidRequestError("messages must be a non-empty list of message dicts", "messages")
            params = resolve_sampling(self.rollout, sampling_overrides)
            how = decoding(self.engine, self.rollout, tools, tool_choice, response_format, parallel_tool_calls)
            params.grammar = how.grammar
            check_engine_features(self.engine, params, self.chat_format.vocab_size)
        except InvalidRequestError as err:
            self._count_failure(f"episode {self.episode_id}: refused a call: {err}", err.param or "request")
            raise
        if params.seed is None and self.rollout.seed is not None:
            params.seed = call_seed(self.rollout.seed, self.episode_id, self._calls_begun)
        self._check_prompt_chars(messages)
        # Rendering and tokenising a long prompt takes CPU time: off the loop that runs the
        # episodes (the tracker is thread-safe), so one long prompt stalls only its own call.
        prompt_ids = await asyncio.to_thread(self.tracker.build_prompt, role, messages, tools, how.prefix)
        requested = params.max_tokens
        params.max_tokens = self._budget(len(prompt_ids), requested)
        options: dict[str, Any] = {}  # what the engine takes beyond the prompt and params
        if on_text is not None and not how.forced and self.engine.supports_streaming:
            options["on_token"] = TextStream(self.chat_format, params.stop, on_text).push
        model = self.model_for(role)
        if model is not None:  # only engines with `supports_models` get here with one
            options["model"] = model
        completion = await self._generate(prompt_ids, params, options)
        return self._finish(role, messages, tools, tool_choice, params, prompt_ids, completion,
                            params.max_tokens < requested, how)

    def _begin_call(self) -> None:
        """Count a call against `rollout.max_calls_per_episode` (CallLimitError past it)."""
        self._check_open()
        self._calls_begun += 1
        if self._calls_begun > self.rollout.max_calls_per_episode:
            message = (
                f"episode {self.episode_id} has made rollout.max_calls_per_episode="
                f"{self.rollout.max_calls_per_episode} LLM calls; no more are served (raise the setting for "
                "agents that need more turns, or end the episode)")
            self._count_failure(message)
            raise CallLimitError(message)

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, options: dict[str, Any]) -> Completion:
        """The engine's one completion; its failures as the session's errors, counted."""
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
        return _single(completions)

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

    def _count_failure(self, refusal: str | None = None, field: str | None = None) -> None:
        """Count a failed call; a refused one (`refusal`: why) also by the `field` to blame. The
        episode's first refused call is logged with its reason, since a client (a CLI harness most
        of all) may retry it quietly or swallow the error; the rest are counted (`close` logs the count)."""
        with self._lock:
            c = self.counters
            c.failed_calls += 1
            if refusal is not None:
                c.refused_calls += 1
            if field is not None:
                c.refused_fields[field] = c.refused_fields.get(field, 0) + 1
            first = refusal is not None and not self._refusal_logged
            if first:
                self._refusal_logged = True
        if first:
            log.warning("%s (the client got it as an error; this episode's later refused calls are "
                        "counted in tuner/failed_calls and gateway/refused/<field>, and logged as a count "
                        "when it ends)", refusal)

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
            self._count_failure(message, "messages")
            raise ContextBudgetError(message)

    def _budget(self, prompt_len: int, requested: int) -> int:
        allowed = call_budget(prompt_len, requested, self.context, self.model_max_len)
        if allowed <= 0:
            message = (
                f"episode {self.episode_id}: the prompt is {prompt_len} tokens, which leaves no room "
                f"for a completion within the model window ({self.model_max_len} tokens). Shorten the "
                "conversation (summarise or drop old turns) or raise context.max_model_len."
            )
            self._count_failure(message, "messages")
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
        how: Decoding,
    ) -> ChatResult:
        text = how.prefix + completion_text(self.chat_format, completion.token_ids, params.stop)
        out = reply(self.chat_format, text, completion.finish_reason, parse=tool_choice != "none",
                    forced=how.forced)
        if out.closed:
            log.debug("episode %s: repaired tool call (%s): %r", self.episode_id, out.closed, text)
        call = LLMCall(
            role=role,
            prompt_ids=list(prompt_ids),
            completion_ids=list(completion.token_ids),
            completion_logprobs=list(completion.logprobs),
            completion_forced=list(completion.forced),
            finish_reason=out.finish_reason,
            policy_version=completion.policy_version,
            messages=[dict(m) for m in messages],
            tools=tools,
            response_message=out.message,
            trainable=self.is_trainable(role),
            repaired_tool_calls=out.repaired,
            malformed_tool_call=out.malformed,
        )
        with self._lock:
            # A call still running when the episode ended is discarded, not recorded.
            self._check_open()
            self.tracker.record(call)
            c = self.counters
            c.calls += 1
            c.per_role_calls[role] = c.per_role_calls.get(role, 0) + 1
            c.malformed_tool_calls += int(out.malformed)
            c.repaired_tool_calls += out.repaired
            c.capped_calls += int(capped)
            c.prompt_tokens += len(prompt_ids)
            c.completion_tokens += len(completion.token_ids)
        if capped:
            log.debug("episode %s: max_tokens capped to %d by the call budget", self.episode_id, params.max_tokens)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion.token_ids),
            "total_tokens": len(prompt_ids) + len(completion.token_ids),
        }
        return ChatResult(out.message, out.finish_reason, usage, call, text, out.malformed, capped,
                          completion.top_logprobs)


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
