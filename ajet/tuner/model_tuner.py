"""`ModelTuner`: what a workflow receives; a drop-in AgentScope 1.x chat model.

`await tuner(messages, tools=..., tool_choice=...)` behaves like AgentScope's
`OpenAIChatModel` with `stream=False` (same arguments, same `ChatResponse` of
`TextBlock` / `ToolUseBlock` content), but every call goes through the episode's
`EpisodeSession`, so it is recorded token for token. Per-role models come from
`register_model` / `get_model`; OpenAI-protocol clients from `openai_client`.

Default models ajet serves itself (`default_model="initial"` or a checkpoint directory) run
on the debug backbone's local engine only (ajet/engine/served_models.py); on trinity / verl, and
with --with-ray, give an AgentScope model instead.

This module subclasses `agentscope.model.ChatModelBase`, so it imports agentscope;
it is imported only with `ajet.tuner`, never by `import ajet` or the CLI.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentscope.message import TextBlock, ToolUseBlock
from agentscope.model import ChatModelBase, ChatResponse
from agentscope.model._model_usage import ChatUsage

from ajet.tuner.openai_compat import MODEL_NAME

if TYPE_CHECKING:  # pragma: no cover
    import openai
    from pydantic import BaseModel

    from ajet.tuner.gateway import Gateway
    from ajet.tuner.session import ChatResult, EpisodeSession

log = logging.getLogger(__name__)

# The tool a `structured_model` request is turned into (as AgentScope's OpenAI model does).
STRUCTURED_TOOL_NAME = "generate_structured_output"


class RoleNotRegisteredError(KeyError):
    """`get_model(role)` for a role that was never registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class _Shared:
    """State shared by the root tuner and the per-role tuners of one episode."""

    gateway: Gateway | None
    trainable_targets: set[str] | None
    models: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)  # role -> the default_model it was registered with
    keys: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ModelTuner(ChatModelBase):
    """The policy model of one episode, as an AgentScope chat model bound to `role`."""

    def __init__(
        self,
        session: EpisodeSession,
        *,
        gateway: Gateway | None = None,
        trainable_targets: list[str] | None = None,
        role: str = "default",
        _shared: _Shared | None = None,
    ) -> None:
        super().__init__(model_name=MODEL_NAME, stream=False)
        self.session = session
        self.role = role
        if _shared is None:
            _shared = _Shared(gateway, _trainable_targets(session, trainable_targets))
            _shared.models[role] = self
        self._shared = _shared

    # -- routing ----------------------------------------------------------------
    @property
    def trainable(self) -> bool:
        """Whether this role's calls are trained."""
        return self.session.is_trainable(self.role)

    def is_trainable_role(self, role: str) -> bool:
        trainable = self._shared.trainable_targets
        return trainable is None or role in trainable

    def register_model(self, role: str, default_model: Any = None) -> Any:
        """Register `role` and return its model.

        A trainable role (in `trainable_targets`, or every role when that is empty) gets
        a `ModelTuner` bound to it (with `model.lora.per_role`, on its own adapter). Another
        role gets `default_model`:
        - any AgentScope model: returned as is; its calls are neither recorded nor trained;
        - `"initial"`: the frozen initial weights (LoRA: the base without adapter; full
          fine-tuning: a frozen copy), or a local checkpoint directory (Hugging Face, or a
          peft adapter of this model's base): served by the engine like the policy (batched,
          prefix-cached), recorded as context only, never trained. Debug backbone only;
        - None: the policy itself, recorded as context only.
        A role is registered once per episode: again with another default_model is an error.
        """
        if not isinstance(role, str) or not role:
            raise ValueError(f"role must be a non-empty string, got {role!r}")
        with self._shared.lock:
            if role in self._shared.defaults and not _same_default(self._shared.defaults[role], default_model):
                raise ValueError(
                    f"role {role!r} is already registered with default_model={self._shared.defaults[role]!r}; "
                    f"registering it again with default_model={default_model!r} would give one role two "
                    f"models. Register each role once per episode (get its model back with "
                    f"tuner.get_model({role!r})), or give the other model another role name")
        if self.is_trainable_role(role) or default_model is None:
            if default_model is not None:
                log.info("role %r is trainable: its default_model is not used", role)
            model: Any = ModelTuner(self.session, role=role, _shared=self._shared)
        elif isinstance(default_model, str):  # "initial" or a checkpoint: served by the engine
            self.session.use_default_model(role, default_model)
            model = ModelTuner(self.session, role=role, _shared=self._shared)
        else:
            model = default_model
        with self._shared.lock:
            self._shared.defaults[role] = default_model
            self._shared.models[role] = model
        return model

    def get_model(self, role: str) -> Any:
        with self._shared.lock:
            model = self._shared.models.get(role)
            registered = sorted(self._shared.models)
        if model is None:
            raise RoleNotRegisteredError(
                f"role {role!r} is not registered; registered roles: {registered}. "
                f"Call tuner.register_model({role!r}, default_model=...) first."
            )
        return model

    def registered_roles(self) -> list[str]:
        """Every role this episode knows: registered (`register_model`, the tuner's own role),
        given an OpenAI-protocol key, or declared trainable. A per-role reward may name only
        these (`ajet.rollout.scoring.role_reward_problem`)."""
        with self._shared.lock:
            roles = set(self._shared.models) | set(self._shared.keys)
        return sorted(roles | (self._shared.trainable_targets or set()))

    # -- OpenAI protocol ------------------------------------------------------------
    def base_url_and_key(self, role: str = "default") -> tuple[str, str]:
        """(base_url, api_key) of the gateway for `role` in this episode."""
        gateway = self._shared.gateway
        if gateway is None:
            raise RuntimeError(
                "this tuner has no gateway, so OpenAI-protocol clients cannot reach it; use the "
                "tuner as an AgentScope model, or start the run with a gateway (the debug backbone "
                "starts one when the workflow asks for openai_client / base_url_and_key)"
            )
        with self._shared.lock:
            key = self._shared.keys.get(role)
            if key is None:
                key = self._shared.keys[role] = gateway.register(self.session, role)
        return gateway.base_url, key

    def openai_client(self, role: str = "default") -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` for `role` of this episode.

        SDK retries are off: a retried request whose first attempt already ran would be
        recorded twice; infrastructure errors are retried per episode by the runner.
        """
        import openai  # ~0.4 s to import, after agentscope: paid only by workflows that ask for a client

        base_url, key = self.base_url_and_key(role)
        timeout = self.session.rollout.episode_timeout_s
        return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout)

    def close(self) -> None:
        """End the episode: its API keys die and further calls raise."""
        gateway = self._shared.gateway
        if gateway is not None:
            gateway.unregister_session(self.session)
        with self._shared.lock:
            self._shared.keys.clear()
        self.session.close()

    # -- AgentScope chat model ----------------------------------------------------
    async def __call__(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        tool_choice: str | None = None,
        structured_model: type[BaseModel] | None = None,
        **kwargs: Any,
    ) -> ChatResponse:
        """Chat like AgentScope's `OpenAIChatModel(stream=False)`.

        `kwargs` are sampling overrides (temperature, top_p, top_k, max_tokens, stop,
        seed). With `structured_model`, tools and tool_choice are replaced by one
        tool built from the model's schema, and the parsed arguments land in
        `response.metadata` (falling back to JSON in the text).
        """
        if not isinstance(messages, list):
            raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
        if structured_model is not None:
            # a private agentscope helper, for structured_model calls only (its import, not the package's)
            from agentscope._utils._common import _create_tool_from_base_model

            if tools or tool_choice:
                log.debug("structured_model given: tools and tool_choice are ignored")
            tools = [_create_tool_from_base_model(structured_model, STRUCTURED_TOOL_NAME)]
            tool_choice = STRUCTURED_TOOL_NAME
        if tool_choice is not None:
            self._validate_tool_choice(tool_choice, tools or [])
        start = time.monotonic()
        result = await self.session.chat(
            self.role, messages, tools, tool_choice=tool_choice, **kwargs
        )
        return to_chat_response(
            result, time.monotonic() - start, structured=structured_model is not None
        )


def to_chat_response(
    result: ChatResult, elapsed_s: float, *, structured: bool = False
) -> ChatResponse:
    """The AgentScope `ChatResponse` of a chat result (pure)."""
    message = result.message
    blocks: list[Any] = []
    if message.get("content"):
        blocks.append(TextBlock(type="text", text=message["content"]))
    metadata: dict[str, Any] | None = None
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        raw = function.get("arguments") or "{}"
        arguments = _arguments_dict(raw)
        blocks.append(
            ToolUseBlock(
                type="tool_use",
                id=call["id"],
                name=function.get("name", ""),
                input=arguments,
                raw_input=raw,
            )
        )
        if structured and metadata is None and function.get("name") == STRUCTURED_TOOL_NAME:
            metadata = arguments
    if structured and metadata is None:
        metadata = _json_object(message.get("content") or "")
    usage = ChatUsage(
        input_tokens=result.usage["prompt_tokens"],
        output_tokens=result.usage["completion_tokens"],
        time=elapsed_s,
    )
    return ChatResponse(content=blocks, usage=usage, metadata=metadata)


def _arguments_dict(raw: str) -> dict[str, Any]:
    value = _json_object(raw)
    if value is None:
        log.warning("tool call arguments are not a JSON object: %.200s", raw)
        return {}
    return value


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _same_default(a: Any, b: Any) -> bool:
    """Whether two default_model values name the same model (a path however it is written)."""
    if isinstance(a, str) and isinstance(b, str):
        return a == b or Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return a is b


def _trainable_targets(session: EpisodeSession, trainable_targets: list[str] | None) -> set[str] | None:
    """The trainable roles: the tuner's must agree with the session's."""
    roles = set(trainable_targets) if trainable_targets else None
    if trainable_targets is None:
        return session.trainable_targets
    if roles != session.trainable_targets:
        raise ValueError(
            f"trainable_targets {sorted(roles or [])} disagree with the session's trainable roles "
            f"{sorted(session.trainable_targets or [])} (empty = all); build both from the same list"
        )
    return roles
