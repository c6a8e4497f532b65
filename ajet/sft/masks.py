"""A dialog -> training `Sample`s whose loss mask covers exactly the assistant turns.

Assistant spans are found by rendering prefixes through the model's chat template
(`ChatFormat`): for assistant message k, `render(messages[:k], generation prompt)` ends
where the reply starts and `render(messages[:k+1])` ends after its turn end. The
trained text is the reply plus the end-of-turn token the model stops on (ChatML:
`content<|im_end|>`, not the newline after it), so the model learns to stop.

Tokens are encoded piece by piece at those boundaries, exactly as the rollout builds a
multi-turn prompt (prompt ids + completion ids + encoded extension), so SFT trains the
token sequences the agent produces and sees at inference.

A template that is not prefix-preserving (one that rewrites earlier turns) cannot give
one sequence for the whole dialog; each assistant turn then becomes its own sample
(prompt = the rendered history), and tree packing shares what their prefixes have in common.
"""

from __future__ import annotations

import logging

from ajet.context.diagnostics import TemplateProbe, probe_template
from ajet.context.types import Sample
from ajet.engine.base import ChatRenderer
from ajet.sft.data import Dialog

log = logging.getLogger(__name__)


def trained_turns(dialog: Dialog) -> list[int]:
    """Indices of the assistant messages to train on (those without `"weight": 0`)."""
    return [
        k for k, m in enumerate(dialog.messages)
        if m["role"] == "assistant" and m.get("weight", 1) != 0
    ]


def dialog_samples(dialog: Dialog, chat: ChatRenderer, probe: TemplateProbe | None = None) -> list[Sample]:
    """One sample for the dialog (or one per assistant turn, see the module docstring)."""
    probe = probe or probe_template(chat)
    turns = trained_turns(dialog)
    if not turns:
        raise ValueError(f"dialog {dialog.dialog_id}: every assistant message has weight 0")
    spans = _char_spans(dialog, chat, probe, turns)
    if spans is None:
        return [_turn_sample(dialog, chat, probe, k, i) for i, k in enumerate(turns)]
    text, char_spans = spans
    ids: list[int] = []
    mask: list[int] = []
    call_ids: list[int] = []
    segments: list[tuple[int, int]] = []
    cursor = 0
    for call, (start, end) in enumerate(char_spans):
        context = chat.encode(text[cursor:start]) if start > cursor else []
        reply = chat.encode(text[start:end])
        ids += context
        mask += [0] * len(context)
        call_ids += [-1] * len(context)
        segments.append((len(ids), len(ids) + len(reply)))
        ids += reply
        mask += [1] * len(reply)
        call_ids += [call] * len(reply)
        cursor = end
    return [_sample(dialog, ids, mask, call_ids, segments)]


def _trained_text(segment: str, probe: TemplateProbe) -> str:
    """The part of an assistant turn to train: the reply and its EOS, not what follows the EOS."""
    post = probe.post_eos if probe.eos_text else ""
    if post and segment.endswith(post):
        return segment[: len(segment) - len(post)]
    return segment


def _char_spans(
    dialog: Dialog, chat: ChatRenderer, probe: TemplateProbe, turns: list[int]
) -> tuple[str, list[tuple[int, int]]] | None:
    """(rendered text up to the last trained turn, [start, end) of each trained reply), or
    None when a rendering is not a prefix of the next one."""
    msgs, tools = dialog.messages, dialog.tools
    last = turns[-1]
    text = chat.render(msgs[: last + 1], tools, add_generation_prompt=False)
    spans = []
    previous_end = 0
    for k in turns:
        prompt = chat.render(msgs[:k], tools, add_generation_prompt=True) if k else ""
        turn = chat.render(msgs[: k + 1], tools, add_generation_prompt=False)
        if not (turn.startswith(prompt) and text.startswith(turn) and len(prompt) >= previous_end):
            log.info("dialog %s: template not prefix-preserving at message %d; one sample per turn",
                     dialog.dialog_id, k)
            return None
        end = len(prompt) + len(_trained_text(turn[len(prompt):], probe))
        spans.append((len(prompt), end))
        previous_end = len(turn)
    return text, spans


def _turn_sample(dialog: Dialog, chat: ChatRenderer, probe: TemplateProbe, k: int, call: int) -> Sample:
    prompt = chat.render(dialog.messages[:k], dialog.tools, add_generation_prompt=True) if k else ""
    turn = chat.render(dialog.messages[: k + 1], dialog.tools, add_generation_prompt=False)
    if not turn.startswith(prompt):
        raise ValueError(
            f"dialog {dialog.dialog_id}: rendering message {k} does not start with the rendered "
            "history plus generation prompt; the chat template cannot be trained turn by turn"
        )
    context = chat.encode(prompt) if prompt else []
    reply = chat.encode(_trained_text(turn[len(prompt):], probe))
    ids = context + reply
    return _sample(
        dialog, ids, [0] * len(context) + [1] * len(reply), [-1] * len(context) + [call] * len(reply),
        [(len(context), len(ids))], turn_index=k,
    )


def _sample(dialog: Dialog, ids: list[int], mask: list[int], call_ids: list[int],
            segments: list[tuple[int, int]], turn_index: int | None = None) -> Sample:
    if mask and mask[0]:
        raise ValueError(f"dialog {dialog.dialog_id}: the first token is an assistant token; "
                         "nothing precedes it to predict it (start the dialog with a user message)")
    metadata: dict[str, str | int] = {"task_type": dialog.task_type, "dialog_id": dialog.dialog_id}
    if turn_index is not None:
        metadata["turn"] = turn_index
    return Sample(
        input_ids=ids, loss_mask=mask, old_logprobs=[0.0] * len(ids), group_id=dialog.dialog_id,
        episode_id=dialog.dialog_id, segments=segments, num_calls=len(segments),
        token_call_ids=call_ids, metadata=metadata,
    )
