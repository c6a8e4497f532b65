"""The forward of a tree-packed sequence with the model's own attention.

A Hugging Face decoder given a 4-D mask `[1, 1, T, T]` uses it as is
(`transformers.masking_utils` returns a 4-D mask unchanged), and with tree
`position_ids` (depth in the tree) each token sees exactly the tokens and the
rotary positions it saw in its own sample: logits equal separate forwards to
float tolerance (tests/integration/test_context_lossless.py). Works with the
eager and SDPA attention implementations; a flash-attention varlen path is not
implemented (it cannot express a tree mask without splitting into chains).

The sequence is always one forward. Its attention is either the model's own under that
mask (one segment), or cut into the segments `ajet.forward.cascade` plans (each tree on its
own, a shared trunk once, each branch against its trunk's keys and values) and computed by
`ajet.forward.tree_attention`, which skips the masked-away pairs. Every plan gives the same
logits (tests/unit/test_forward_cascade.py).

Logits are computed only at loss-entry positions (`logits_to_keep` with indices),
so memory is O(entries x vocab), not O(tokens x vocab); with `logits_chunk > 0` (and a
model whose logits are a plain LM head over its decoder's output) they are computed that
many entries at a time by `ajet.forward.logprobs.token_logprobs`, O(chunk x vocab).
"""

from __future__ import annotations

from typing import Protocol, TypeGuard

import torch

from ajet.context.pack import PackedSequence
from ajet.forward.cascade import Piece, plan_pieces
from ajet.forward.logprobs import token_logprobs
from ajet.forward.tree_attention import base_attention, install_tree_attention, tree_layout
from ajet.forward.tree_mask import ancestor_mask, subtree_ends

__all__ = ["tree_attention_mask", "forward_packed", "forward_plan"]


def tree_attention_mask(
    parents: list[int], dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """Additive float mask [1, 1, T, T]: 0 where token i may attend (itself, its ancestors)."""
    allowed = ancestor_mask(parents, device)
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    mask.masked_fill_(allowed, 0.0)
    return mask[None, None]


def forward_packed(
    model: torch.nn.Module,
    packed: PackedSequence,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    split: str = "cost",
    logits_chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the entry tokens under `model`.

    `temperature` divides the logits first, matching how the rollout sampled.
    `split` picks the attention segments (`ajet.forward.cascade`): "cost" by the cost
    model, "never" the model's own attention under the 4-D tree mask, "always" a segment
    per trunk and per branch.
    `logits_chunk > 0`: the LM head runs on that many entries at a time (see the module doc).
    Returns float32 tensors of shape [E] (E = packed.num_entries).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    device = next(model.parameters()).device
    if not packed.entry_pos:
        empty = torch.zeros(0, device=device)
        return empty, (empty if with_entropy else None)
    tokens = torch.tensor(packed.entry_token, device=device)
    head_split = _decoder_and_head(model) if logits_chunk > 0 else None
    rows = _entry_rows(model, packed, split, device, head_split)  # [E, H] or [E, V], entry order
    if head_split is not None:
        return token_logprobs(rows, head_split[1], tokens, temperature=temperature,
                              chunk_size=logits_chunk, with_entropy=with_entropy)
    logits = rows.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    entry_logprobs = logp.gather(-1, tokens[:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logp.exp() * logp).sum(-1)
    return entry_logprobs, entropy


# Model types whose logits are exactly `lm_head(decoder(...).last_hidden_state)` (no logit
# scaling or soft-capping after the head): the chunked path computes the same values.
_PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})

# (decoder, LM head) of a causal LM: the chunked path runs them one after the other.
HeadSplit = tuple[torch.nn.Module, torch.nn.Module]


class _SplitLM(Protocol):
    """What the chunked path calls on a causal LM: transformers' PreTrainedModel has both, and a
    peft wrapper hands them on to the model it wraps."""

    def get_output_embeddings(self) -> torch.nn.Module | None: ...

    def get_decoder(self) -> torch.nn.Module: ...


def _is_split_lm(model: torch.nn.Module) -> TypeGuard[_SplitLM]:
    # hasattr, not a runtime-checkable Protocol: since Python 3.12 isinstance looks attributes up
    # statically, and a peft wrapper has these two only through its __getattr__.
    return hasattr(model, "get_output_embeddings") and hasattr(model, "get_decoder")


def _decoder_and_head(model: torch.nn.Module) -> HeadSplit | None:
    """(decoder, LM head) of a plain-head causal LM (a peft wrapper included), else None."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_TYPES or not _is_split_lm(model):
        return None
    head = model.get_output_embeddings()
    return None if head is None else (model.get_decoder(), head)


def _entry_rows(
    model: torch.nn.Module, packed: PackedSequence, split: str, device: torch.device,
    head_split: HeadSplit | None = None,
) -> torch.Tensor:
    """Logits [E, V] at the entry positions, in entry order, from one forward; with
    `head_split` (decoder, LM head), the decoder's final hidden states [E, H] instead."""
    pieces = forward_plan(packed, split=split)
    unique = sorted(set(packed.entry_pos))
    at = {pos: k for k, pos in enumerate(unique)}
    rows = torch.tensor([at[p] for p in packed.entry_pos], dtype=torch.long, device=device)
    keep = torch.tensor(unique, dtype=torch.long, device=device)
    inputs = {
        "input_ids": torch.tensor([packed.input_ids], device=device),
        "position_ids": torch.tensor([packed.position_ids], device=device),
        "use_cache": False,
    }
    layout = None
    if len(pieces) == 1 and not pieces[0].children:
        # One segment: the model's own attention, under the tree mask unless it is a chain.
        if any(p != i - 1 for i, p in enumerate(packed.parents)):
            inputs["attention_mask"] = _model_mask(model, packed.parents, device)
    else:
        _attention_impl(model)  # raises for attention that takes no 4-D mask
        install_tree_attention(model)
        layout = tree_layout(pieces, packed.parents, device)
        inputs["ajet_tree"] = layout
        # A 4-D placeholder: transformers passes a 4-D mask through as is, instead of
        # building a T x T one from the tree positions that tree attention would not read.
        inputs["attention_mask"] = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    out: torch.Tensor
    if head_split is not None:
        out = head_split[0](**inputs).last_hidden_state[0, keep]
    else:
        # squeeze, not [0]: in backward a select would fill a zero [1, E, V] tensor first.
        out = model(**inputs, logits_to_keep=keep).logits.squeeze(0).float()
    if layout is not None and layout.calls == 0:
        raise RuntimeError(
            f"{type(model).__name__} does not route attention through transformers' "
            "AttentionInterface, so the tree-packed attention was not applied; "
            "use split='never' (one forward under a 4-D tree mask) for this model."
        )
    if packed.entry_pos == unique:  # distinct and in order: rows == arange, skip the copy
        return out
    return out[rows]


def forward_plan(packed: PackedSequence, *, split: str = "cost") -> list[Piece]:
    """The attention segments `forward_packed` uses for `packed` (see `ajet.forward.cascade`)."""
    ends = subtree_ends(packed.parents)
    if ends is None:  # not pre-order: only the whole-sequence mask can express it
        return [Piece(0, packed.num_tokens)]
    return plan_pieces(packed.parents, ends, split=split)


def _attention_impl(model: torch.nn.Module) -> str:
    """The model's attention implementation, if tree packing can use it (it must take a
    4-D mask; the segmented attention calls SDPA in its place)."""
    impl = base_attention(model)
    if impl not in ("sdpa", "eager"):
        raise ValueError(
            f"tree packing needs the model's attention to accept a 4-D mask, but it uses "
            f"attn_implementation={impl!r}. Load the model with attn_implementation='sdpa' "
            "(or 'eager'), or set context.tree_packing=false."
        )
    return impl


def _model_mask(model: torch.nn.Module, parents: list[int], device: torch.device) -> torch.Tensor:
    """The 4-D mask [1, 1, T, T] in the form the model's attention takes: every token sees
    itself and its ancestors among `parents`."""
    impl = _attention_impl(model)
    allowed = ancestor_mask(parents, device)
    if impl == "sdpa":
        # A bool mask keeps working under bf16 autocast (SDPA wants bool or the query's dtype).
        return allowed[None, None]
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(allowed, 0.0)[None, None]
