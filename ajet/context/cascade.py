"""Which forwards a tree-packed sequence is computed in (shared-prefix / cascade plan).

One forward of the whole packed sequence with a 4-D tree mask computes attention for
every (query, key) pair of the sequence, T x T, and masks most of it away: on CPU the
SDPA kernel does not skip masked blocks. Three 550-token branches under a 5-token trunk
then cost 1638^2 attention pairs, where forwarding each branch on its own costs
3 x 550^2. The plan below cuts the tree instead:

- every tree of the sequence (a root and its subtree) is forwarded on its own;
- a *trunk* (the chain from a subtree's root to its first branch point) is forwarded once,
  and each child subtree is forwarded with the trunk's keys and values as its past
  (attention to a past is exact: the trunk is an ancestor of every node below it);
- a subtree whose pieces would cost more than forwarding it whole (tiny branches, where
  the per-forward overhead dominates) is forwarded whole under a tree mask.

The choice is by a cost model in "token forwards": a token costs 1, an attention pair
`ATTENTION_PAIR` and a forward call `FORWARD_CALL`. The constants were read off a torch
profile of the bundled model's fwd+bwd on CPU (docs/benchmarks.md); they only decide
speed, never the result: every plan computes the same logits.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Piece", "plan_pieces", "ATTENTION_PAIR", "FORWARD_CALL"]

# A (query, key) pair of attention against a token's other work (fwd+bwd, bundled model,
# CPU): a token attending to ~4,000 keys costs as much again as its own linear layers.
ATTENTION_PAIR = 2.5e-4
# A forward call's fixed cost (per-layer Python and kernel launches, fwd+bwd), in tokens.
FORWARD_CALL = 16.0
# Past this many nested branch points a subtree is forwarded whole (bounds the recursion).
MAX_DEPTH = 64


@dataclass(frozen=True)
class Piece:
    """One forward: the packed positions [start, stop), with the keys and values of the
    piece it hangs under (and so of all its ancestors) as past. `children` are forwarded
    after it with this piece's keys and values appended to that past."""

    start: int
    stop: int
    children: tuple[Piece, ...] = ()


def plan_pieces(
    parents: list[int], ends: list[int], *, share_kv: bool = True, split: str = "cost"
) -> list[Piece]:
    """The forwards that compute a pre-order packed sequence (`ends` from its layout).

    `share_kv=False` (the model cannot take a past, e.g. under gradient checkpointing)
    only separates the trees. `split`: "cost" picks by the cost model, "always" cuts at
    every branch point (tests), "never" returns the whole sequence as one piece.
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
        c, piece = _plan(root, 0, ends, nchild, share_kv, split, 0)
        pieces.append(piece)
        cost += c
        root = ends[root]
    if pieces != whole and split == "cost" and cost >= _cost(n, 0, chain=False):
        return whole
    return pieces


def _cost(q: int, past: int, *, chain: bool) -> float:
    """Estimated cost of one forward of q tokens after `past` tokens."""
    pairs = q * (q + 1) / 2 if chain and not past else q * (past + q)
    return FORWARD_CALL + q + ATTENTION_PAIR * pairs


def _plan(
    root: int, past: int, ends: list[int], nchild: list[int], share_kv: bool, split: str, depth: int
) -> tuple[float, Piece]:
    """(cost, piece) of the subtree at `root`, forwarded after `past` ancestor tokens."""
    last = root
    while nchild[last] == 1:  # pre-order: an only child directly follows its parent
        last += 1
    size = ends[root] - root
    whole = _cost(size, past, chain=nchild[last] == 0)
    if nchild[last] == 0 or not share_kv or depth >= MAX_DEPTH:
        return whole, Piece(root, ends[root])
    trunk = last + 1 - root
    cost = _cost(trunk, past, chain=True)
    kids = []
    child = last + 1
    while child < ends[last]:
        c, piece = _plan(child, past + trunk, ends, nchild, share_kv, split, depth + 1)
        cost += c
        kids.append(piece)
        child = ends[child]
    if split == "always" or cost < whole:
        return cost, Piece(root, last + 1, tuple(kids))
    return whole, Piece(root, ends[root])
