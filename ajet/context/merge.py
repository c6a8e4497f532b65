"""Lossless merging: an episode's timelines -> per-role prefix trees -> samples.

Pure functions over `Timeline`/`Sample` (no model, no tokenizer).

- `merge_timelines`: within a role, a timeline whose tokens are a prefix of another
  timeline's is absorbed into it; a linear ReAct episode of N calls is one sample.
- `timelines_to_samples`: one `Sample` per remaining timeline. A call's trained
  tokens are trained in exactly one sample (the first that holds them), so the loss
  over the samples equals the loss over one sample per call.
"""

from __future__ import annotations

import copy
from collections import defaultdict

from ajet.context.types import LLMCall, Sample, Timeline

__all__ = ["BREAKS", "break_of", "merge_timelines", "per_call_samples", "timelines_to_samples", "token_calls"]

# Why a sample starts where it does, named from its timeline's fork cause (`FORK_CAUSES`): the
# episode's (or a role's) first sample is no break; the others say why their history could not
# be merged with what came before. `Sample.metadata["break"]`, the token records' "break", the
# viewer's sample head and the step's `context/breaks/<name>` counts use these names.
BREAKS = {
    "first_call": "",
    "other_role": "",
    "history_rewritten": "rewrite",  # the agent edited, dropped or summarised earlier messages
    "template_not_prefix_preserving": "template",  # the chat template renders history differently
    "tools_changed": "tools changed",
    "reply_mismatch": "reply changed",  # the reply sent back is not the one generated
    "reply_truncated": "truncation",  # ... of a reply cut at max_tokens
    "retry": "branch",  # a sibling from the same history (a retry, two calls from one state)
    "branch": "branch",
    "concurrent_call": "branch",
    "untracked_prompt": "untracked prompt",
}


def break_of(fork_cause: str) -> str:
    """The break name of a fork cause ("" for none); an unknown cause is its own name."""
    return BREAKS.get(fork_cause, fork_cause)


def token_calls(timeline: Timeline) -> list[int]:
    """Per token: the call index whose trainable completion token it is, else -1."""
    owner = [-1] * len(timeline.token_ids)
    for call, (start, end) in zip(timeline.call_indices, timeline.completion_spans, strict=True):
        for i in range(start, end):
            if timeline.trainable[i]:
                owner[i] = call
    return owner


def merge_timelines(timelines: list[Timeline]) -> list[Timeline]:
    """Absorb, per role, every timeline whose token ids are a prefix of another's.

    Absorbing keeps the absorbed timeline's trainable tokens trainable (and their
    logprobs). A timeline is not absorbed where one of its trainable tokens sits
    on a token the other timeline trains for a *different* call (two calls that
    sampled the same tokens): both are kept, so both losses count.
    The result keeps the input order of the surviving timelines; inputs are not modified.
    """
    by_role: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(timelines):
        by_role[t.role].append(i)
    kept: dict[int, Timeline] = {}
    for indices in by_role.values():
        # Longest first, so each timeline meets every possible absorber before itself.
        order = sorted(indices, key=lambda i: (-len(timelines[i].token_ids), i))
        survivors: list[int] = []
        for i in order:
            t = timelines[i]
            owner = token_calls(t)
            target = next((j for j in survivors if _absorbable(t, owner, kept[j])), None)
            if target is None:
                kept[i] = copy.deepcopy(t)
                survivors.append(i)
            else:
                _absorb(kept[target], t, owner)
    return [kept[i] for i in sorted(kept)]


def _absorbable(t: Timeline, owner: list[int], into: Timeline) -> bool:
    n = len(t.token_ids)
    if n > len(into.token_ids) or into.token_ids[:n] != t.token_ids:
        return False
    into_owner = token_calls(into)
    return all(a == -1 or b == -1 or a == b for a, b in zip(owner, into_owner, strict=False))


def _absorb(into: Timeline, t: Timeline, owner: list[int]) -> None:
    if not break_of(t.fork_cause):  # `into` now holds a role's first call: it starts no break
        into.fork_cause = t.fork_cause
    spans = dict(zip(into.call_indices, into.completion_spans, strict=True))
    for call, span in zip(t.call_indices, t.completion_spans, strict=True):
        if call not in spans:
            spans[call] = span
            start, end = span
            into.logprobs[start:end] = t.logprobs[start:end]
    for i, call in enumerate(owner):
        if call != -1:
            into.trainable[i] = True
    ordered = sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0]))
    into.call_indices = [call for call, _ in ordered]
    into.completion_spans = [span for _, span in ordered]


def timelines_to_samples(
    timelines: list[Timeline],
    *,
    episode_id: str,
    group_id: str,
    reward: float,
    drop_untrained: bool = True,
) -> list[Sample]:
    """One `Sample` per timeline of one episode (advantages are left to the algorithm).

    A call's tokens are trained only in the first sample that holds them: where two
    leaves share a trunk with trained tokens (a retry after call 1), the trunk is
    context in the second. `token_call_ids` names the call of each trained token.
    Samples with no trained token (roles outside `trainable_targets`) are dropped
    unless `drop_untrained=False`.
    """
    trained: set[int] = set()
    samples: list[Sample] = []
    for t in timelines:
        owner = token_calls(t)
        mine = {c for c in owner if c != -1} - trained
        trained |= mine
        call_ids = [c if c in mine else -1 for c in owner]
        loss_mask = [int(c != -1) for c in call_ids]
        if drop_untrained and not any(loss_mask):
            continue
        segments = [
            span
            for call, span in zip(t.call_indices, t.completion_spans, strict=True)
            if call in mine
        ]
        samples.append(
            Sample(
                input_ids=list(t.token_ids),
                loss_mask=loss_mask,
                old_logprobs=[
                    lp if m else 0.0 for lp, m in zip(t.logprobs, loss_mask, strict=True)
                ],
                group_id=group_id,
                episode_id=episode_id,
                role=t.role,
                reward=float(reward),
                segments=segments,
                num_calls=len(mine),
                token_call_ids=call_ids,
                metadata={"timeline_id": t.timeline_id, "policy_version": t.policy_version,
                          "break": break_of(t.fork_cause)},
            )
        )
    return samples


def per_call_samples(
    calls: list[LLMCall], *, episode_id: str, group_id: str, reward: float
) -> list[Sample]:
    """The unmerged baseline: one sample per trainable call (its prompt + completion).

    What merging and packing are measured and tested against: the same loss, more tokens.
    """
    samples = []
    for call in calls:
        if not call.trainable or not call.completion_ids:
            continue
        n_prompt, n_completion = len(call.prompt_ids), len(call.completion_ids)
        trained = [0 if f else 1 for f in call.completion_forced or [False] * n_completion]
        if not any(trained):  # every token forced by a grammar: nothing to train
            continue
        samples.append(
            Sample(
                input_ids=call.prompt_ids + call.completion_ids,
                loss_mask=[0] * n_prompt + trained,
                old_logprobs=[0.0] * n_prompt
                + [lp if m else 0.0 for lp, m in zip(call.completion_logprobs, trained, strict=True)],
                group_id=group_id,
                episode_id=episode_id,
                role=call.role,
                reward=float(reward),
                segments=[(n_prompt, n_prompt + n_completion)],
                num_calls=1,
                token_call_ids=[-1] * n_prompt + [call.call_index if m else -1 for m in trained],
            )
        )
    return samples
