"""What the tracker needs to know about a chat template, found by rendering probes.

The tracker extends a prompt by appending tokens instead of re-tokenizing the
history (docs/concepts.md, `ContextTracker` and Merge). That is only exact when
the template is *prefix-preserving* (rendering a conversation and then one more
turn gives the first render as a textual prefix) and when we know what the
template writes around the end-of-turn token. Both are learned here by rendering
small conversations; nothing about a particular template is hard-coded.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

from ajet.context.types import JSON
from ajet.engine.base import ChatRenderer

log = logging.getLogger(__name__)

_MARK = "ajet-probe-reply-7"
_PROBE_USER: JSON = {"role": "user", "content": "ajet probe question"}


@dataclass(frozen=True)
class TemplateProbe:
    """How the template closes an assistant turn.

    `turn_end` is the text rendered after an assistant message's content (ChatML:
    "<|im_end|>\\n"); `eos_text` is its leading part that encodes to the end-of-turn
    token the engine stops on ("<|im_end|>"), "" when the turn end holds no EOS token.
    """

    turn_end: str
    eos_text: str

    @property
    def post_eos(self) -> str:
        """What the template writes after the EOS of an assistant turn (ChatML: "\\n")."""
        return self.turn_end[len(self.eos_text) :]


def probe_template(renderer: ChatRenderer) -> TemplateProbe:
    """Render a one-turn conversation and read how the assistant turn ends."""
    messages: list[JSON] = [_PROBE_USER, {"role": "assistant", "content": _MARK}]
    text = renderer.render(messages, None, add_generation_prompt=False)
    at = text.rfind(_MARK)
    if at < 0:
        # The template rewrites assistant content (e.g. drops it): nothing can be extended.
        return TemplateProbe(turn_end="", eos_text="")
    turn_end = text[at + len(_MARK) :]
    return TemplateProbe(turn_end=turn_end, eos_text=_eos_prefix(renderer, turn_end))


def _eos_prefix(renderer: ChatRenderer, turn_end: str) -> str:
    """The shortest prefix of `turn_end` whose encoding ends with an EOS token id.

    Found by encoding prefixes rather than decoding the EOS id, because a renderer's
    `decode` may skip special tokens.
    """
    eos = set(renderer.eos_token_ids)
    for end in range(1, len(turn_end) + 1):
        ids = renderer.encode(turn_end[:end])
        if ids and ids[-1] in eos:
            return turn_end[:end]
    return ""


def extension_ids(
    renderer: ChatRenderer,
    probe: TemplateProbe,
    completion_ids: list[int],
    new_text: str,
) -> list[int] | None:
    """The ids to append after `completion_ids` so the prompt continues with `new_text`.

    `new_text` is what the template renders after the assistant turn (the next
    messages and the generation prompt). A completion that ended on an EOS token
    needs only what follows the EOS (ChatML: "\\n"); one cut by `length` (no EOS)
    also needs the end-of-turn itself, as context. None when the template's turn end
    holds no EOS token, so the two cases cannot be told apart.
    """
    if not probe.eos_text:
        return None
    ends_on_eos = bool(completion_ids) and completion_ids[-1] in renderer.eos_token_ids
    head = probe.post_eos if ends_on_eos else probe.turn_end
    return renderer.encode(head + new_text)


def check_prefix_preserving(renderer: ChatRenderer) -> bool:
    """Pre-flight check: does extending a prompt by tokens equal re-tokenizing it?

    Renders a short multi-turn conversation, builds the second prompt the way the
    tracker does (first prompt ids + reply ids + EOS + extension) and compares it
    with the tokens of the full render, for a reply that ends on EOS and for one cut
    by `length`.
    """
    probe = probe_template(renderer)
    if not probe.eos_text:
        return False
    system: JSON = {"role": "system", "content": "You are a careful assistant."}
    reply_text = "The answer is 42."
    follow_up: JSON = {"role": "user", "content": "Why?"}
    first = [system, _PROBE_USER]
    prompt_ids = renderer.encode(renderer.render(first, None, add_generation_prompt=True))
    eos_ids = renderer.encode(probe.eos_text)
    for completion in (renderer.encode(reply_text) + eos_ids, renderer.encode(reply_text)):
        history = first + [{"role": "assistant", "content": reply_text}]
        with_reply = renderer.render(history, None, add_generation_prompt=False)
        full = renderer.render(history + [follow_up], None, add_generation_prompt=True)
        if not full.startswith(with_reply):
            return False
        tail = extension_ids(renderer, probe, completion, full[len(with_reply) :])
        if tail is None or prompt_ids + completion + tail != renderer.encode(full):
            return False
    return True


# Per renderer object (weakly held): (probe, prefix-preserving?), computed once.
_cache: weakref.WeakKeyDictionary[ChatRenderer, tuple[TemplateProbe, bool]] = weakref.WeakKeyDictionary()


def inspect_template(renderer: ChatRenderer) -> TemplateProbe:
    """`probe_template`, plus the pre-flight check with a warning, once per renderer object."""
    try:
        return _cache[renderer][0]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable (or unhashable): probe every time
        _check_and_warn(renderer)
        return probe_template(renderer)
    probe = probe_template(renderer)
    _cache[renderer] = (probe, not report_template(renderer))
    return probe


def _check_and_warn(renderer: ChatRenderer) -> bool:
    return not report_template(renderer)


# Per tokenizer (weakly held): the shapes where the template breaks, computed and logged once,
# by whichever comes first: the run's start (`ajet.rollout.engine_rollout`) or a tracker's first prompt.
_reported: weakref.WeakKeyDictionary[object, list[TemplateBreak]] = weakref.WeakKeyDictionary()


def report_template(renderer: ChatRenderer) -> list[TemplateBreak]:
    """`template_breaks`, logged the first time for a tokenizer: INFO when every shape keeps its
    tokens, else a WARNING naming the shapes, the first differing token and what ajet does."""
    key = getattr(renderer, "tokenizer", renderer)
    try:
        return _reported[key]
    except (KeyError, TypeError):
        pass
    breaks = template_breaks(renderer)
    (log.warning if breaks else log.info)(template_report(renderer, breaks))
    try:
        _reported[key] = breaks
    except TypeError:  # not weak-referenceable: checked (and logged) again next time
        pass
    return breaks


# --- The shapes a workflow's history takes ------------------------------------------------------
_CALC_TOOL: JSON = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
SHAPE_TOOLS = [_CALC_TOOL]  # the tools offered in every shape
_SYSTEM: JSON = {"role": "system", "content": "You are a careful assistant."}
_ASK: JSON = {"role": "user", "content": "What is 2 + 3?"}
_CALL: JSON = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "add", "arguments": '{"a": 2, "b": 3}'}}]}
_RESULT: JSON = {"role": "tool", "tool_call_id": "call_1", "content": "5"}
_ANSWER: JSON = {"role": "assistant", "content": "2 + 3 = 5."}
_THANKS: JSON = {"role": "user", "content": "Thanks. And 4 + 4?"}
_REASONED: JSON = {"role": "assistant", "content": "<think>2 plus 3 is 5.</think>2 + 3 = 5."}

# A reply the engine cut at max_tokens: no end-of-turn token was sampled, so the tracker adds it
# (as context) before the next turn.
CUT_SHAPE = "a user turn after a reply cut at max_tokens"
# (what is appended, the history before the model's reply, the reply, what the client sends next)
SHAPES: tuple[tuple[str, list[JSON], JSON, list[JSON]], ...] = (
    ("a user turn after a text reply (with a system prompt)", [_SYSTEM, _ASK], _ANSWER, [_THANKS]),
    (CUT_SHAPE, [_SYSTEM, _ASK], _ANSWER, [_THANKS]),
    ("a user turn after a text reply (no system prompt)", [_ASK], _ANSWER, [_THANKS]),
    ("a tool result after a tool call", [_SYSTEM, _ASK], _CALL, [_RESULT]),
    ("a user turn after a reply that followed a tool result", [_SYSTEM, _ASK, _CALL, _RESULT], _ANSWER, [_THANKS]),
    ("a user turn after a reply with reasoning (<think>)", [_SYSTEM, _ASK], _REASONED, [_THANKS]),
)


@dataclass(frozen=True)
class TemplateBreak:
    """Where extending a prompt by tokens (as the tracker does) differs from re-tokenizing the
    whole conversation, for one message shape: the first differing token of the full prompt."""

    shape: str
    position: int  # index of the first differing token in the full prompt
    template: str  # the token the re-rendered conversation has there ("" past its end)
    extended: str  # the token the extended prompt has there ("" past its end)

    def describe(self) -> str:
        return (f"{self.shape}: token {self.position} is {self.template!r} when the conversation is re-rendered "
                f"but {self.extended!r} when the earlier prompt is extended")


def template_breaks(renderer: ChatRenderer, tools: list[JSON] | None = None) -> list[TemplateBreak]:
    """For each of `SHAPES` (system prompts, text replies, tool calls, tool results, reasoning): build the
    next prompt as the tracker does (the earlier prompt's ids + the reply's ids + the extension
    the template renders after it) and compare it with the tokens of the whole conversation
    rendered at once. Returns the shapes where they differ; [] means the template keeps earlier
    turns' tokens for every shape. A template that cannot render a shape is a break at token 0."""
    tools = SHAPE_TOOLS if tools is None else tools
    probe = probe_template(renderer)
    out = []
    for shape, history, reply, following in SHAPES:
        try:
            built, full_ids = _extended_and_full(renderer, probe, tools, history, reply, following,
                                                 cut=shape == CUT_SHAPE)
        except Exception as exc:  # noqa: BLE001 - a template that raises on a shape is what we report
            out.append(TemplateBreak(shape, 0, f"<the template raised {type(exc).__name__}: {exc}>", ""))
            continue
        if built == full_ids:
            continue
        at = next((i for i, (a, b) in enumerate(zip(built, full_ids, strict=False)) if a != b),
                  min(len(built), len(full_ids)))
        out.append(TemplateBreak(shape, at, _token_at(renderer, full_ids, at), _token_at(renderer, built, at)))
    return out


def _token_at(renderer: ChatRenderer, ids: list[int], at: int) -> str:
    return renderer.decode([ids[at]]) if at < len(ids) else ""


def _extended_and_full(renderer: ChatRenderer, probe: TemplateProbe, tools: list[JSON], history: list[JSON],
                       reply: JSON, following: list[JSON], *, cut: bool = False) -> tuple[list[int], list[int]]:
    """(the next prompt as the tracker builds it, the whole conversation's tokens). Where the
    template changes earlier text, the first is what the tracker holds: the prompt and reply."""
    prompt = renderer.render(history, tools, add_generation_prompt=True)
    with_reply = renderer.render([*history, reply], tools, add_generation_prompt=False)
    full = renderer.render([*history, reply, *following], tools, add_generation_prompt=True)
    full_ids = renderer.encode(full)
    if not (with_reply.startswith(prompt) and probe.turn_end and with_reply.endswith(probe.turn_end)):
        return renderer.encode(with_reply), full_ids
    reply_text = with_reply[len(prompt):len(with_reply) - len(probe.turn_end)]
    completion = renderer.encode(reply_text) + ([] if cut else renderer.encode(probe.eos_text))
    held = renderer.encode(prompt) + completion
    if not full.startswith(with_reply):
        return held, full_ids  # the earlier text itself changed
    tail = extension_ids(renderer, probe, completion, full[len(with_reply):])
    return (held if tail is None else held + tail), full_ids


TEMPLATE_BREAK_EFFECT = (
    "ajet builds each call's prompt from the earlier call's token ids, so where this break applies the "
    "call starts a new timeline (context/fork/template_not_prefix_preserving): it is trained as its own "
    "sample, on exactly the tokens the model saw, and is not merged with the calls before it (more "
    "samples, more prefill, the same loss). Nothing is re-tokenized."
)


def template_report(renderer: ChatRenderer, breaks: list[TemplateBreak] | None = None) -> str:
    """One line (or a few) for `--dry-run` and the start of a run (`breaks`: `template_breaks`'s
    answer when the caller has it already)."""
    breaks = template_breaks(renderer) if breaks is None else breaks
    if not breaks:
        return ("chat template: prefix-preserving for system prompts, text replies, replies cut at max_tokens, "
                "tool calls, tool results and reasoning (multi-turn calls merge into one sample)")
    lines = [f"chat template: not prefix-preserving for {len(breaks)} of {len(SHAPES)} message shapes:"]
    lines += [f"  - {b.describe()}" for b in breaks]
    lines.append(f"  {TEMPLATE_BREAK_EFFECT}")
    return "\n".join(lines)
