"""One forward of a tree-packed sequence with the model's own attention.

A Hugging Face decoder given a 4-D additive mask `[1, 1, T, T]` uses it as is
(`transformers.masking_utils` returns a 4-D mask unchanged), and with tree
`position_ids` (depth in the tree) each token sees exactly the tokens and the
rotary positions it saw in its own sample: logits equal separate forwards to
float tolerance (tests/integration/test_context_lossless.py). Works with the
eager and SDPA attention implementations; a flash-attention varlen path is not
implemented (it cannot express a tree mask without splitting into chains).

Logits are computed only at loss-entry positions (`logits_to_keep` with indices),
so memory is O(entries x vocab), not O(tokens x vocab); with `logits_chunk > 0` (and a
model whose logits are a plain LM head over its decoder's output) they are computed that
many entries at a time by `ajet.context.logprobs.token_logprobs`, O(chunk x vocab).
"""

from __future__ import annotations

import torch

from ajet.context.pack import PackedSequence

__all__ = ["tree_attention_mask", "forward_packed"]


def _ancestor_mask(parents: list[int], device: torch.device | str | None) -> torch.Tensor:
    """Bool [T, T]: row i is True at i and at every ancestor of i."""
    n = len(parents)
    end = _subtree_ends(parents)
    if end is not None:
        # Pre-order layout: the subtree of j is the contiguous range [j, end[j]).
        idx = torch.arange(n, device=device)
        ends = torch.tensor(end, device=device)
        return (idx[None, :] <= idx[:, None]) & (idx[:, None] < ends[None, :])
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in _topological(parents):
        if parents[i] >= 0:
            mask[i] = mask[parents[i]]
        mask[i, i] = True
    return mask.to(device)


def _subtree_ends(parents: list[int]) -> list[int] | None:
    """End (exclusive) of each node's subtree if the layout is depth-first pre-order, else None."""
    path: list[int] = []  # the root-to-node path of the previous node
    for i, p in enumerate(parents):
        while path and path[-1] != p:
            path.pop()
        if p >= 0 and not path:
            return None  # the parent is not on the current path: subtrees interleave
        path.append(i)
    end = list(range(1, len(parents) + 1))
    for i in range(len(parents) - 1, -1, -1):
        if parents[i] >= 0:
            end[parents[i]] = max(end[parents[i]], end[i])
    return end


def _topological(parents: list[int]) -> list[int]:
    order, seen = [], [False] * len(parents)
    for start in range(len(parents)):
        chain = []
        node = start
        while node >= 0 and not seen[node]:
            chain.append(node)
            node = parents[node]
        for node in reversed(chain):
            seen[node] = True
            order.append(node)
    return order


def tree_attention_mask(
    parents: list[int], dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """Additive float mask [1, 1, T, T]: 0 where token i may attend (itself, its ancestors)."""
    allowed = _ancestor_mask(parents, device)
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    mask.masked_fill_(allowed, 0.0)
    return mask[None, None]


def forward_packed(
    model: torch.nn.Module,
    packed: PackedSequence,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
    logits_chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the entry tokens under `model`, from one forward.

    `temperature` divides the logits first, matching how the rollout sampled.
    `logits_chunk > 0`: the LM head runs on that many entries at a time (see the module doc).
    Returns float32 tensors of shape [E] (E = packed.num_entries).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    device = next(model.parameters()).device
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    if not packed.entry_pos:
        empty = torch.zeros(0, device=device)
        return empty, (empty if with_entropy else None)
    input_ids = torch.tensor([packed.input_ids], device=device)
    position_ids = torch.tensor([packed.position_ids], device=device)
    mask = _model_mask(model, packed.parents, dtype, device)
    unique_pos, inverse = torch.unique(
        torch.tensor(packed.entry_pos, device=device), return_inverse=True
    )
    tokens = torch.tensor(packed.entry_token, device=device)
    split = _decoder_and_head(model) if logits_chunk > 0 else None
    if split is not None:
        from ajet.context.logprobs import token_logprobs

        decoder, head = split
        hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
        return token_logprobs(hidden[0, unique_pos][inverse], head, tokens, temperature=temperature,
                              chunk_size=logits_chunk, with_entropy=with_entropy)
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=unique_pos,
    )
    logits = out.logits[0].float()[inverse]  # [E, V]
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


def _decoder_and_head(model: torch.nn.Module):
    """(decoder, LM head) of a plain-head causal LM (a peft wrapper included), else None."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    head = model.get_output_embeddings()
    return None if head is None else (model.get_decoder(), head)


def _model_mask(
    model: torch.nn.Module, parents: list[int], dtype: torch.dtype, device: torch.device
):
    """The 4-D mask in the form the model's attention implementation takes; None for a chain."""
    if all(p == i - 1 for i, p in enumerate(parents)):
        return None  # a single causal sequence: let the model use its own (fast) causal path
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager"
    if impl == "sdpa":
        # A bool mask keeps working under bf16 autocast (SDPA wants bool or the query's dtype).
        return _ancestor_mask(parents, device)[None, None]
    if impl == "eager":
        return tree_attention_mask(parents, dtype=dtype, device=device)
    raise ValueError(
        f"tree packing needs the model's attention to accept a 4-D mask, but it uses "
        f"attn_implementation={impl!r}. Load the model with attn_implementation='sdpa' (or 'eager'), "
        "or set context.tree_packing=false."
    )
