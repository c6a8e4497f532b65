"""How the attention of a tree-packed sequence is cut (the shared-prefix / cascade plan).

The packed sequence is forwarded once; only its attention is cut into *segments*
(`ajet.forward.tree_attention` computes them). One segment for the whole sequence
under a 4-D tree mask computes attention for every (query, key) pair, T x T, and masks
most of it away: the SDPA kernels do not skip masked blocks. Three 550-token branches
under a 5-token trunk then cost 1638^2 pairs, where cutting costs about 3 x 550^2. So:

- every tree of the sequence (a root and its subtree) is a segment of its own;
- a *trunk* (the chain from a subtree's root to its first branch point) is a segment,
  and each child subtree is planned below it, attending to the trunk's keys and values
  (exact: the trunk is an ancestor of every node below it);
- a subtree whose segments would cost more than keeping it whole under a tree mask
  (tiny branches, where a segment's fixed cost dominates) stays one segment.

The choice is by a cost model in "token forwards" (the fwd+bwd of one token through the
linear layers costs 1): an attention pair costs `ATTENTION_PAIR`, a segment `SEGMENT`.
A chain runs SDPA's causal kernel, which skips the upper triangle (half the pairs); under
ancestors it does so with the ancestors' queries recomputed and dropped, where that is
cheaper than a mask over its own queries (`causal_is_cheaper`). Every token is forwarded once whatever the plan, so tokens do
not enter the choice. The constants are measured on the bundled model's fwd+bwd on CPU
(`scripts/tools/calibrate_cascade.py`, docs/log/2026-11-23_engine_memory_context.md); they only decide speed,
never the result: every plan computes the same logits.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Piece", "plan_pieces", "attention_pairs", "causal_is_cheaper", "ATTENTION_PAIR", "SEGMENT"]

# Measured by scripts/tools/calibrate_cascade.py (bundled model, fp32, fwd+bwd, 1 thread, CPU time;
# 2026-11-23, load average ~8, so +-20%): a token 13.5 ms through the linear layers, an
# attention pair 2.9 us (all 30 layers), a segment 26 ms. In tokens:
# a (query, key) pair of attention,
ATTENTION_PAIR = 2.2e-4
# a segment's fixed cost (per layer: slicing and concatenating keys and values, an SDPA
# call, and their backward).
SEGMENT = 2.0
# Past this many nested branch points a subtree stays one segment (bounds the recursion).
MAX_DEPTH = 64


@dataclass(frozen=True)
class Piece:
    """One attention segment: the queries at packed positions [start, stop) attend to
    the pieces above it (its ancestors) and to themselves (causally, or under the tree
    mask of the subtree it holds). `children` are the segments below it."""

    start: int
    stop: int
    children: tuple[Piece, ...] = ()


def plan_pieces(parents: list[int], ends: list[int], *, split: str = "cost") -> list[Piece]:
    """The attention segments of a pre-order packed sequence (`ends` from its layout).

    `split`: "cost" picks by the cost model, "always" cuts at every branch point (tests),
    "never" returns the whole sequence as one segment.
    """
    n = len(parents)
    whole = [Piece(0, n)]
    if split == "never" or n == 0:
        return whole
    nchild = [0] * n
    for p in parents:
        if p >= 0:
            nchild[p] += 1
    pieces, cost = [], 0.0
    root = 0
    while root < n:
        c, piece = _plan(root, 0, ends, nchild, split, 0)
        pieces.append(piece)
        cost += c
        root = ends[root]
    if pieces != whole and split == "cost" and cost >= _cost(n, 0, chain=False):
        return whole
    return pieces


def causal_is_cheaper(q: int, past: int) -> bool:
    """Whether a chain of q queries under `past` ancestor tokens (a chain too: trunks are)
    is cheaper computed causally over past + q queries, the past's rows recomputed and
    dropped, than under a mask: (past + q)^2 / 2 pairs against q (past + q)."""
    return past < q


def attention_pairs(q: int, past: int, *, chain: bool) -> float:
    """The (query, key) pairs SDPA computes for a segment (the causal kernel skips the
    upper triangle; a masked one computes every pair)."""
    if chain and causal_is_cheaper(q, past):
        return (past + q) * (past + q + 1) / 2
    return q * (past + q)


def _cost(q: int, past: int, *, chain: bool) -> float:
    """Estimated attention cost of a segment of q queries under `past` ancestor tokens."""
    return SEGMENT + ATTENTION_PAIR * attention_pairs(q, past, chain=chain)


def _plan(
    root: int, past: int, ends: list[int], nchild: list[int], split: str, depth: int
) -> tuple[float, Piece]:
    """(cost, piece) of the subtree at `root`, forwarded after `past` ancestor tokens."""
    last = root
    while nchild[last] == 1:  # pre-order: an only child directly follows its parent
        last += 1
    size = ends[root] - root
    whole = _cost(size, past, chain=nchild[last] == 0)
    if nchild[last] == 0 or depth >= MAX_DEPTH:
        return whole, Piece(root, ends[root])
    trunk = last + 1 - root
    cost = _cost(trunk, past, chain=True)
    kids = []
    child = last + 1
    while child < ends[last]:
        c, piece = _plan(child, past + trunk, ends, nchild, split, depth + 1)
        cost += c
        kids.append(piece)
        child = ends[child]
    if split == "always" or cost < whole:
        return cost, Piece(root, last + 1, tuple(kids))
    return whole, Piece(root, ends[root])
