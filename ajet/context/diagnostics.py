"""What the tracker needs to know about a chat template, found by rendering probes.

The tracker extends a prompt by appending tokens instead of re-tokenizing the
history (DESIGN.md, "The context tracker and merging"). That is only exact when
the template is *prefix-preserving* (rendering a conversation and then one more
turn gives the first render as a textual prefix) and when we know what the
template writes around the end-of-turn token. Both are learned here by rendering
small conversations; nothing about a particular template is hard-coded.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

from ajet.engine.base import ChatRenderer

log = logging.getLogger(__name__)

_MARK = "ajet-probe-reply-7"
_PROBE_USER = {"role": "user", "content": "ajet probe question"}


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
    messages = [_PROBE_USER, {"role": "assistant", "content": _MARK}]
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
    system = {"role": "system", "content": "You are a careful assistant."}
    reply_text = "The answer is 42."
    follow_up = {"role": "user", "content": "Why?"}
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
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    _cache[renderer] = (probe, _check_and_warn(renderer))
    return probe


def _check_and_warn(renderer: ChatRenderer) -> bool:
    ok = check_prefix_preserving(renderer)
    if not ok:
        log.warning(
            "The chat template is not prefix-preserving: extending a prompt by tokens does not "
            "equal re-tokenizing it, so multi-turn calls will start new timelines "
            "(context/fork/template_not_prefix_preserving) and cannot be merged. Use a template "
            "that renders earlier turns unchanged when a turn is added."
        )
    return ok
