"""Attention of a tree-packed sequence, piece by piece, inside one forward.

One forward of a packed sequence under a 4-D tree mask computes attention for every
(query, key) pair, T x T, and masks most of it away: the SDPA kernels do not skip masked
blocks. Forwarding each piece of the tree on its own, with its ancestors' keys and values
as a past, saves those pairs but pays a whole forward per piece, and in backward every
forward materialises a full-size weight gradient (a [out, in] matmul and an accumulation
per linear layer, the dense embedding gradient too): on CPU about as much as 150 tokens of
fwd+bwd each (docs/log/2026-11-23_engine_memory_context.md), which lost 2-5x on GRPO-style trees.

Here the sequence is forwarded once (the linear layers see every distinct token once, in
one matmul each) and only attention is cut: the attention implementation registered below
runs SDPA per *segment* (a piece of `ajet.forward.cascade`'s plan), with the segment's
queries against the keys and values of its ancestors' segments plus its own. A chain uses
SDPA's causal kernel (which skips the upper triangle), under ancestors with their queries
recomputed and dropped where that is cheaper (`cascade.causal_is_cheaper`); any other
segment (a whole subtree kept in one, a short branch under a long trunk) a bool mask. The
result is the 4-D-mask forward's, up to float summation order; autograd does the backward.

`install_tree_attention` registers this implementation (over the model's own) and the
layout travels to every layer as the `ajet_tree` keyword, which transformers passes from
the model's forward down to its attention function.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

import torch

from ajet.forward.cascade import Piece, causal_is_cheaper
from ajet.forward.tree_mask import ancestor_mask

__all__ = ["Segment", "TreeLayout", "tree_layout", "install_tree_attention", "base_attention"]

log = logging.getLogger(__name__)

# The installed implementation's name is this prefix + the model's own ("ajet_tree_sdpa").
_PREFIX = "ajet_tree_"


class AttentionFunction(Protocol):
    """transformers' attention-function signature (what `AttentionInterface` holds)."""

    def __call__(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, /, *, dropout: float = ..., scaling: float | None = ...,
                 **kwargs: object) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass(frozen=True)
class Segment:
    """Queries [start, stop); keys and values at `keys` (ranges: the ancestors' segments,
    then the segment itself); `mask` bool [1, 1, q, k]. With `mask` None the segment and
    its ancestors form one chain, computed causally with queries at all of `keys`, of
    which the last stop - start rows are kept."""

    start: int
    stop: int
    keys: tuple[tuple[int, int], ...]
    mask: torch.Tensor | None
    # The keys as indices of segments (in sequence order): what `_gather` concatenates.
    key_segments: tuple[int, ...] = ()


@dataclass
class TreeLayout:
    """What the attention function needs: the segments in sequence order (they tile the
    sequence: `sizes` are their lengths). `calls` counts the attention layers that used it
    (0 after a forward: the model ignored it)."""

    segments: list[Segment]
    calls: int = field(default=0)

    @property
    def sizes(self) -> list[int]:
        return [seg.stop - seg.start for seg in self.segments]


def tree_layout(pieces: list[Piece], parents: list[int], device: torch.device | str) -> TreeLayout:
    """The segments of a plan (`ajet.forward.cascade.plan_pieces`) for a pre-order sequence."""
    segments: list[Segment] = []
    stack: list[tuple[Piece, tuple[tuple[int, int], ...]]] = [(p, ()) for p in reversed(pieces)]
    while stack:
        piece, above = stack.pop()
        a, b = piece.start, piece.stop
        keys = _merged(above + ((a, b),))
        local = [p - a if p >= a else -1 for p in parents[a:b]]
        chain = all(p == i - 1 for i, p in enumerate(local))
        past = sum(hi - lo for lo, hi in above)
        mask = None
        if not (chain and (not past or causal_is_cheaper(b - a, past))):
            allowed = ancestor_mask(local, device)
            if past:
                seen = torch.ones(b - a, past, dtype=torch.bool, device=allowed.device)
                allowed = torch.cat([seen, allowed], dim=1)
            mask = allowed[None, None]
        segments.append(Segment(a, b, keys, mask))
        stack.extend((child, above + ((a, b),)) for child in reversed(piece.children))
    segments.sort(key=lambda s: s.start)
    if [s.start for s in segments[1:]] != [s.stop for s in segments[:-1]] or segments[0].start != 0:
        raise ValueError("the attention segments must tile the packed sequence")  # a plan's invariant
    index = {seg.start: k for k, seg in enumerate(segments)}
    ends = {seg.stop: k for k, seg in enumerate(segments)}
    return TreeLayout([
        replace(seg, key_segments=tuple(k for lo, hi in seg.keys for k in range(index[lo], ends[hi] + 1)))
        for seg in segments
    ])


def _merged(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Adjacent ranges joined (a trunk and its first child are one slice, not a cat)."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _gather(parts: tuple[torch.Tensor, ...], indices: tuple[int, ...]) -> torch.Tensor:
    """The segments `indices` of a state split by segment, joined along the sequence."""
    return parts[indices[0]] if len(indices) == 1 else torch.cat([parts[k] for k in indices], dim=2)


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    ajet_tree: TreeLayout | None = None,
    *,
    ajet_base: str = "sdpa",
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention-function signature: [B, H, T, D] in, [B, T, H, D] out.
    Without a layout (every forward that is not a tree-packed one: generation, the engine)
    it is the model's own implementation `ajet_base`, unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if ajet_tree is None:
        return _base_function(module, ajet_base)(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # `attention_mask` is the placeholder `forward_packed` passes to skip building a T x T
    # mask nobody reads: each segment brings its own.
    ajet_tree.calls += 1
    # Split once per state, not a slice per segment: in backward a slice fills a zero tensor of
    # the whole state's size for its gradient, a split joins its parts' gradients in one copy.
    sizes = ajet_tree.sizes
    queries, keys, values = (states.split(sizes, dim=2) for states in (query, key, value))
    outs = []
    for k, seg in enumerate(ajet_tree.segments):
        causal = seg.mask is None
        out, _ = sdpa_attention_forward(
            module,
            _gather(queries, seg.key_segments) if causal else queries[k],
            _gather(keys, seg.key_segments),
            _gather(values, seg.key_segments),
            seg.mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=causal,
            # The keywords transformers gave this layer, handed on as received: as objects they
            # cannot be matched to sdpa_attention_forward's typed parameters.
            **kwargs,  # type: ignore[arg-type]
        )
        outs.append(out[:, -(seg.stop - seg.start) :] if causal else out)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), None


def _base_function(module: torch.nn.Module, base: str) -> AttentionFunction:
    from transformers import AttentionInterface

    if base != "eager":
        registered: AttentionFunction = AttentionInterface()[base]
        return registered
    # Each modeling file defines its own eager attention; the layer's module holds it.
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ValueError(f"{type(module).__name__} has no eager_attention_forward to fall back to")
    found: AttentionFunction = eager
    return found


def base_attention(model: torch.nn.Module) -> str:
    """The model's attention implementation ("sdpa", "eager", ...), installed or not."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager"
    return impl.removeprefix(_PREFIX)


def install_tree_attention(model: torch.nn.Module) -> None:
    """Switch the model, for good, to `tree_attention_forward` over its own implementation.

    For good, not around one forward: under activation checkpointing a layer's forward
    runs again in backward, after `forward_packed` returned, and must dispatch the same
    way. Forwards without the `ajet_tree` keyword keep the original attention function
    and mask function, so generation and the engine (which shares this model) see no
    change. The name is not saved with the config (transformers drops it).
    """
    from transformers import AttentionInterface, PretrainedConfig
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    config = model.config
    if not isinstance(config, PretrainedConfig):
        raise TypeError(f"tree attention is installed on a transformers model; {type(model).__name__}.config "
                        f"is a {type(config).__name__}")
    base = base_attention(model)
    name = _PREFIX + base
    if config._attn_implementation == name:
        return
    AttentionInterface.register(name, partial(tree_attention_forward, ajet_base=base))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    config._attn_implementation = name
    log.debug("tree attention installed over %s attention", base)
