"""The attention mask of a token tree: each token sees itself and its ancestors."""

from __future__ import annotations

import torch


def ancestor_mask(parents: list[int], device: torch.device | str | None) -> torch.Tensor:
    """Bool [T, T]: row i is True at i and at every ancestor of i."""
    n = len(parents)
    end = subtree_ends(parents)
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


def subtree_ends(parents: list[int]) -> list[int] | None:
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
