"""ContextTracker: token-in, token-out prompts and the timelines of one episode.

When a call's messages are an earlier call's messages + that call's reply + new
messages, its prompt is `earlier.prompt_ids + earlier.completion_ids + bridge`,
where the bridge is the tokenized text the template puts after the reply. History
is never re-tokenized, so a timeline's tokens are exactly what the model saw and
produced, and merging is exact. Anything else starts a new timeline and the cause
is counted (`fork/<cause>` in `stats()`).

Every call belongs to exactly one timeline: the one it started or extended. A call
that extends an earlier call whose timeline has already moved on (a retry, two
calls from one state) starts a new timeline ("branch") that holds the shared trunk
as context only, so every completion token is trainable in exactly one timeline.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ajet.config.schema import ContextConfig
from ajet.context.diagnostics import (
    TemplateProbe,
    check_prefix_preserving,
    extension_ids,
    inspect_template,
)
from ajet.context.types import JSON, LLMCall, Timeline
from ajet.engine.base import ChatRenderer

__all__ = ["ContextTracker", "check_prefix_preserving", "FORK_CAUSES"]

log = logging.getLogger(__name__)

FORK_CAUSES = (
    "first_call",  # the episode's first call
    "other_role",  # the first call of a role, after calls of other roles
    "tools_changed",  # the tool specs differ from the role's previous call
    "history_rewritten",  # earlier messages were edited, dropped or summarised
    "reply_mismatch",  # the reply sent back is not the one generated
    "reply_truncated",  # the same, for a reply cut at max_tokens (the agent sent back other text)
    "template_not_prefix_preserving",  # the template renders history differently once extended
    "retry",  # the same messages as an earlier call (its prompt ids are reused)
    "branch",  # extends an earlier call whose timeline already moved on
    "concurrent_call",  # built while the role's earlier calls were still running
    "untracked_prompt",  # recorded with prompt ids that build_prompt did not return
)


@dataclass
class _Node:
    """A recorded call plus what the tracker needs to extend it."""

    call: LLMCall
    prompt_text: str | None  # the render its prompt came from; None if not built here
    tools_key: str
    timeline: int  # index into ContextTracker._chains


@dataclass
class _Built:
    tools_key: str
    prompt_text: str
    parent: int | None  # call_index of the call this prompt extends
    cause: str  # why not, when parent is None


class ContextTracker:
    """Builds prompts for one episode's calls and records them as timelines. Thread-safe."""

    def __init__(
        self, renderer: ChatRenderer, trainable_targets: set[str] | None, config: ContextConfig
    ) -> None:
        self.renderer = renderer
        # None or empty: every role is trained (docs/concepts.md, `Workflow`: `trainable_targets`).
        self.trainable_targets = set(trainable_targets) if trainable_targets else None
        self.config = config
        self.calls: list[LLMCall] = []
        self._nodes: list[_Node] = []
        self._chains: list[list[int]] = []  # per timeline: its call indices
        self._built: dict[tuple[str, tuple[int, ...]], _Built] = {}
        self._lock = threading.RLock()
        self._probe: TemplateProbe | None = None

    # ------------------------------------------------------------------ prompts
    def build_prompt(
        self, role: str, messages: list[JSON], tools: list[JSON] | None, reply_prefix: str = ""
    ) -> list[int]:
        """The prompt ids for a call; extends an earlier call's tokens where possible.

        `reply_prefix`: forced start of the reply (e.g. `tool_choice` markup), part of the
        prompt: context, never trained; the reply that continues it renders back as a prefix.
        """
        with self._lock:
            if self._probe is None:
                # Warns once per renderer; each extension is still checked on its own text.
                self._probe = inspect_template(self.renderer)
            full = self.renderer.render(messages, tools, add_generation_prompt=True) + reply_prefix
            tools_key = _tools_key(tools)
            ids, parent, cause = self._match(role, messages, tools, tools_key, full)
            self._built[(role, tuple(ids))] = _Built(tools_key, full, parent, cause)
            return list(ids)

    def _match(
        self, role: str, messages: list[JSON], tools: list[JSON] | None, tools_key: str, full: str
    ) -> tuple[list[int], int | None, str]:
        same_role = [
            n for n in reversed(self._nodes) if n.call.role == role and n.prompt_text is not None
        ]
        cache: dict[int, str] = {}

        def history_same(node: _Node) -> bool:
            """Do `messages` start with the node's messages (compared as rendered text)?"""
            k = len(node.call.messages)
            if len(messages) < k:
                return False
            if _canon(messages[:k]) == _canon(node.call.messages):
                return True
            if k not in cache:
                cache[k] = self.renderer.render(messages[:k], tools, add_generation_prompt=True)
            return cache[k] == node.prompt_text

        cause = "first_call" if not self._nodes else "other_role"
        for i, node in enumerate(same_role):
            # Only the role's latest call is diagnosed; older ones are skipped cheaply.
            if i > 0 and not full.startswith(node.prompt_text or "\0"):
                continue
            reason = self._extend(node, messages, tools, tools_key, full, history_same)
            if isinstance(reason, list):
                call = node.call
                # A retry of the latest call's messages extends that call's parent.
                return (
                    call.prompt_ids + call.completion_ids + reason,
                    call.call_index,
                    ("retry" if cause == "retry" else ""),
                )
            if i == 0:
                cause = reason
        # No extension: reuse the longest earlier prompt the new render starts with.
        best: _Node | None = None
        for node in same_role:
            text = node.prompt_text or "\0"
            if node.tools_key == tools_key and full.startswith(text) and history_same(node):
                if best is None or len(text) > len(best.prompt_text or ""):
                    best = node
        if best is not None and best.prompt_text is not None:
            if len(messages) == len(best.call.messages):
                cause = "retry"
            tail = full[len(best.prompt_text) :]
            return best.call.prompt_ids + (self.renderer.encode(tail) if tail else []), None, cause
        return self.renderer.encode(full), None, cause

    def _extend(
        self,
        node: _Node,
        messages: list[JSON],
        tools: list[JSON] | None,
        tools_key: str,
        full: str,
        history_same: Callable[[_Node], bool],
    ) -> list[int] | str:
        """The bridge ids that extend `node` to `messages`, or why it cannot be extended."""
        call, probe, prompt_text = node.call, self._probe, node.prompt_text
        assert probe is not None and prompt_text is not None
        k = len(call.messages)
        if node.tools_key != tools_key:
            return "tools_changed"
        if not history_same(node):
            return "history_rewritten"
        if len(messages) == k:
            return "retry"
        reply = messages[k]
        if not isinstance(reply, dict) or reply.get("role") != "assistant":
            return "reply_mismatch"
        with_reply = self.renderer.render(messages[: k + 1], tools, add_generation_prompt=False)
        if not probe.turn_end or not with_reply.startswith(prompt_text):
            return "template_not_prefix_preserving"
        reply_text = with_reply[len(prompt_text) :]
        if not reply_text.endswith(probe.turn_end):
            return "template_not_prefix_preserving"
        content = reply_text[: len(reply_text) - len(probe.turn_end)]
        if not self._same_reply(call, content, with_reply, messages, tools):
            return "reply_truncated" if call.finish_reason == "length" else "reply_mismatch"
        if not full.startswith(with_reply):
            return "template_not_prefix_preserving"
        bridge = extension_ids(self.renderer, probe, call.completion_ids, full[len(with_reply) :])
        return "template_not_prefix_preserving" if bridge is None else bridge

    def _same_reply(
        self, call: LLMCall, content: str, with_reply: str, messages: list[JSON], tools: list[JSON] | None
    ) -> bool:
        """Is the reply the agent sent back the one generated? Compared as rendered text.

        Accepted when the rendered reply is the decoded completion (up to surrounding
        whitespace, which agents often strip), or when it renders exactly like the
        message the agent received (tool calls parsed from the text render back in the
        template's own format, not byte-identical to what the model wrote).
        """
        ids = call.completion_ids
        if ids and ids[-1] in self.renderer.eos_token_ids:
            ids = ids[:-1]
        generated = self.renderer.decode(ids)
        if content == generated or content.strip() == generated.strip():
            return True
        if not call.response_message:
            return False
        k = len(call.messages)
        received = self.renderer.render(
            messages[:k] + [call.response_message], tools, add_generation_prompt=False
        )
        return received == with_reply

    # ------------------------------------------------------------------ records
    def record(self, call: LLMCall) -> None:
        """Record a finished call; sets `call_index`, `timeline_id`, `fork_cause`, `trainable`."""
        if len(call.completion_logprobs) != len(call.completion_ids):
            raise ValueError(
                f"LLMCall of role {call.role!r} has {len(call.completion_ids)} completion ids but "
                f"{len(call.completion_logprobs)} logprobs; the engine must return one logprob per token."
            )
        if call.completion_forced and len(call.completion_forced) != len(call.completion_ids):
            raise ValueError(
                f"LLMCall of role {call.role!r} has {len(call.completion_ids)} completion ids but "
                f"{len(call.completion_forced)} forced flags; give one per token or none."
            )
        with self._lock:
            call.call_index = len(self.calls)
            call.trainable = bool(call.trainable) and (
                self.trainable_targets is None or call.role in self.trainable_targets
            )
            built = self._built.get((call.role, tuple(call.prompt_ids)))
            if built is not None:
                parent, cause, text, tools_key = (
                    built.parent,
                    built.cause,
                    built.prompt_text,
                    built.tools_key,
                )
            else:
                parent, cause = self._parent_by_tokens(call), "untracked_prompt"
                text, tools_key = None, _tools_key(call.tools)
                if parent is None and not self.calls:
                    cause = "first_call"
            if parent is None and cause in ("first_call", "other_role"):
                cause = self._root_cause(call)  # calls may have been recorded since the build
            tip = parent is not None and self._chains[self._nodes[parent].timeline][-1] == parent
            if parent is not None and not tip:
                cause = cause if cause == "retry" else "branch"
            if tip and parent is not None:
                timeline = self._nodes[parent].timeline
                self._chains[timeline].append(call.call_index)
                cause = ""
            else:
                timeline = len(self._chains)
                self._chains.append([call.call_index])
            call.timeline_id, call.fork_cause = timeline, cause
            self.calls.append(call)
            self._nodes.append(_Node(call, text, tools_key, timeline))

    def _root_cause(self, call: LLMCall) -> str:
        same_role = [c for c in self.calls if c.role == call.role]
        if any(c.prompt_ids == call.prompt_ids for c in same_role):
            return "retry"
        if same_role:
            return "concurrent_call"
        return "other_role" if self.calls else "first_call"

    def _parent_by_tokens(self, call: LLMCall) -> int | None:
        """For prompts not built here: the latest same-role call the prompt extends, by tokens."""
        for node in reversed(self._nodes):
            c = node.call
            seen = c.prompt_ids + c.completion_ids
            if (
                c.role == call.role
                and len(seen) <= len(call.prompt_ids)
                and call.prompt_ids[: len(seen)] == seen
            ):
                return c.call_index
        return None

    # ------------------------------------------------------------------ outputs
    def timelines(self) -> list[Timeline]:
        """One timeline per extension chain, with trainable masks and rollout logprobs."""
        with self._lock:
            return [self._timeline(i, chain) for i, chain in enumerate(self._chains)]

    def _timeline(self, timeline_id: int, chain: list[int]) -> Timeline:
        last = self.calls[chain[-1]]
        tokens = last.prompt_ids + last.completion_ids
        trainable = [False] * len(tokens)
        logprobs = [0.0] * len(tokens)
        spans: list[tuple[int, int]] = []
        for index in chain:
            call = self.calls[index]
            start = len(call.prompt_ids)
            end = start + len(call.completion_ids)
            spans.append((start, end))
            logprobs[start:end] = call.completion_logprobs
            if call.trainable:
                forced = call.completion_forced or [False] * (end - start)
                trainable[start:end] = [not f for f in forced]
        return Timeline(
            timeline_id=timeline_id,
            role=last.role,
            token_ids=tokens,
            trainable=trainable,
            logprobs=logprobs,
            call_indices=list(chain),
            completion_spans=spans,
            policy_version=last.policy_version,
            fork_cause=self.calls[chain[0]].fork_cause,
        )

    def stats(self) -> dict[str, float]:
        """`calls`, `timelines` and `fork/<cause>` counts (one per timeline started);
        `tool_calls/repaired` and `tool_calls/malformed` when any call had one."""
        with self._lock:
            out: dict[str, float] = {
                "calls": float(len(self.calls)),
                "timelines": float(len(self._chains)),
            }
            for call in self.calls:
                counts = (
                    (f"fork/{call.fork_cause}", float(bool(call.fork_cause))),
                    ("tool_calls/repaired", float(call.repaired_tool_calls)),
                    ("tool_calls/malformed", float(call.malformed_tool_call)),
                )
                for key, n in counts:
                    if n:
                        out[key] = out.get(key, 0.0) + n
            return out


def _tools_key(tools: list[JSON] | None) -> str:
    return json.dumps(tools or [], sort_keys=True, default=str)


def _canon(messages: list[JSON]) -> str:
    """Exact-equality fast path (identical dicts render identically)."""
    return json.dumps(messages, sort_keys=True, default=str)
