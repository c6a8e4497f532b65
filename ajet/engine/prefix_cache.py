"""The local engine's prefix KV cache: a radix tree over token ids (as SGLang's RadixAttention).

Each edge of the tree holds a run of token ids and their keys/values, as one tensor
`[layers, 2 (keys, values), kv_heads, tokens, head_dim]`. A path from the root spells a token
prefix that was prefilled (or decoded) before; a new prompt that starts with it reuses its KV
and prefills only the rest. Agent workloads hit it three ways: the next turn of an episode
extends the previous turn's prompt and completion, the n episodes of a GRPO group share their
prompt, and tasks share a system prompt.

Memory: the tree holds at most `budget_tokens` tokens; when an insert goes over, the least
recently used leaves are evicted first. A path a running request has matched is locked
(`Match.release()` unlocks it) and is never evicted; the tree may then exceed the budget
until the request ends.

Validity: KV depends on the weights. The tree carries the policy version it was filled at;
`sync(version)` empties it when the engine's version moved on, so KV from old weights never
serves a request under new ones; except the namespaces `keep` says are frozen (a frozen
default model's, whose weights an update never changes): their trees stay. KV depends on the model too: each `namespace` (the engine's
(model, LoRA adapter) of a request, ajet/engine/served_models.py) has its own tree, so one adapter's
KV never serves another's request; the budget and the LRU order span every tree. Everything
here runs on the engine thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

# KV of a token range of one sequence: [layers, 2, kv_heads, tokens, head_dim].
KVSlice = Callable[[int, int], "torch.Tensor"]  # (start, end) -> that range's KV, owned (a copy)


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]  # the edge from the parent
    kv: torch.Tensor | None  # KV of `tokens`; None only for the root
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)  # keyed by first token of the edge
    locks: int = 0  # running requests whose matched path goes through this node
    last_used: int = 0

    @property
    def edge_kv(self) -> torch.Tensor:
        """KV of `tokens` (a node below the root)."""
        assert self.kv is not None, "the root has no KV"
        return self.kv


@dataclass(eq=False)
class Match:
    """The cached part of a prompt: `length` tokens whose KV is `segments` (views, in order,
    along the token axis). Holds a lock on its path until `release()`."""

    length: int
    segments: list[torch.Tensor]
    _nodes: list[_Node]

    def release(self) -> None:
        for node in self._nodes:
            node.locks -= 1
        self._nodes = []


class PrefixCache:
    """Radix tree of token prefixes and their KV, bounded to `budget_tokens` (LRU)."""

    def __init__(self, budget_tokens: int, keep: Callable[[Hashable], bool] | None = None) -> None:
        if budget_tokens < 1:
            raise ValueError(f"budget_tokens={budget_tokens}: must be >= 1 (0 turns the cache off in LocalEngine)")
        self.budget_tokens = budget_tokens
        self._keep = keep or (lambda namespace: False)  # namespaces whose KV no update invalidates
        self.version = 0
        self.tokens = 0  # tokens held by the tree
        self.evicted_tokens = 0
        self._roots: dict[Hashable, _Node] = {}  # one tree per namespace
        self._clock = itertools.count(1)

    def sync(self, version: int) -> None:
        """Empty the tree if it was filled under another policy version (frozen namespaces stay)."""
        if version != self.version:
            self.clear()
            self.version = version

    def clear(self) -> None:
        """Drop every tree but the frozen namespaces' (`keep`)."""
        # Nodes still locked by running requests are detached; their release() is harmless.
        self._roots = {namespace: root for namespace, root in self._roots.items() if self._keep(namespace)}
        self.tokens = sum(len(node.tokens) for node in self._nodes())

    def _root(self, namespace: Hashable) -> _Node:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = _Node((), None, None)
        return root

    def match(self, ids: list[int], max_length: int | None = None, namespace: Hashable = None) -> Match:
        """Lock and return the longest cached prefix of `ids[:max_length]` in `namespace`."""
        limit = len(ids) if max_length is None else min(len(ids), max_length)
        node, at = self._root(namespace), 0
        segments: list[torch.Tensor] = []
        nodes: list[_Node] = []
        now = next(self._clock)
        while at < limit:
            child = node.children.get(ids[at])
            if child is None:
                break
            common = _common_length(child.tokens, ids, at, limit)
            child.locks += 1
            child.last_used = now
            nodes.append(child)
            segments.append(child.edge_kv if common == len(child.tokens) else child.edge_kv[:, :, :, :common])
            at += common
            if common < len(child.tokens):
                break
            node = child
        return Match(at, segments, nodes)

    def insert(self, ids: list[int], kv_slice: KVSlice, namespace: Hashable = None) -> int:
        """Add `ids` with their KV (`kv_slice(start, end)` copies the part not yet cached) to
        `namespace`; return how many tokens were new. Evicts LRU leaves if over the budget."""
        node, at = self._root(namespace), 0
        now = next(self._clock)
        while at < len(ids):
            child = node.children.get(ids[at])
            if child is None:
                break
            common = _common_length(child.tokens, ids, at, len(ids))
            if common < len(child.tokens):
                child = self._split(child, common)
            child.last_used = now
            node, at = child, at + common
        new = len(ids) - at
        if new:
            leaf = _Node(tuple(ids[at:]), kv_slice(at, len(ids)), node, last_used=now)
            node.children[ids[at]] = leaf
            self.tokens += new
        self._evict()
        return new

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.tokens)
        # Copies, so that evicting either half frees its own memory.
        # No lock of its own: while `child` is locked, `upper` has a child and is no leaf.
        upper = _Node(child.tokens[:at], child.edge_kv[:, :, :, :at].clone(), parent, last_used=child.last_used)
        child.kv = child.edge_kv[:, :, :, at:].clone()
        child.tokens = child.tokens[at:]
        child.parent = upper
        upper.children[child.tokens[0]] = child
        parent.children[upper.tokens[0]] = upper
        return upper

    def _evict(self) -> None:
        if self.tokens <= self.budget_tokens:
            return
        leaves = [n for n in self._nodes() if not n.children and n.locks == 0]
        while self.tokens > self.budget_tokens and leaves:
            leaves.sort(key=lambda n: n.last_used, reverse=True)
            victim = leaves.pop()
            parent = victim.parent
            assert parent is not None
            del parent.children[victim.tokens[0]]
            self.tokens -= len(victim.tokens)
            self.evicted_tokens += len(victim.tokens)
            if parent.parent is not None and not parent.children and parent.locks == 0:  # not a root
                leaves.append(parent)

    def _nodes(self) -> list[_Node]:
        out, stack = [], [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def _common_length(edge: tuple[int, ...], ids: list[int], at: int, limit: int) -> int:
    """How many leading tokens of `edge` equal `ids[at:limit]`."""
    n = min(len(edge), limit - at)
    if tuple(ids[at : at + n]) == edge[:n]:  # the usual case: the whole edge matches
        return n
    i = 0
    while i < n and edge[i] == ids[at + i]:
        i += 1
    return i


def shared_prefixes(prompts: list[list[int]], min_tokens: int) -> list[list[list[int]]]:
    """Prefixes worth prefilling once before the prompts: layers of distinct prefixes, shortest
    layer first, where each is the longest prefix a prompt shares with another prompt (at
    least `min_tokens`, and short of the prompt's last token, which the request prefills
    itself to get its logits). A later layer's prefixes extend an earlier layer's.

    E.g. 4 tasks x 4 episodes under one system prompt give [[system prompt], [4 task prompts]].
    """
    layers: list[list[tuple[int, ...]]] = []
    level = _longest_shared([tuple(p) for p in prompts], min_tokens, keep_last=True)
    while level:
        inner = set(_longest_shared(sorted(level), min_tokens, keep_last=False))
        layers.append(sorted(level - inner))
        level = inner
    return [[list(p) for p in layer] for layer in reversed(layers)]


def _longest_shared(seqs: list[tuple[int, ...]], min_tokens: int, keep_last: bool) -> set[tuple[int, ...]]:
    """For each sequence, its longest common prefix with any other (neighbours once sorted)."""
    ordered = sorted(set(seqs))
    counts = {s: seqs.count(s) for s in ordered} if keep_last else {}
    out = set()
    for i, seq in enumerate(ordered):
        best = len(seq) if counts.get(seq, 1) > 1 else 0  # identical prompts share everything
        for j in (i - 1, i + 1):
            if 0 <= j < len(ordered):
                best = max(best, _lcp(seq, ordered[j]))
        if keep_last:
            best = min(best, len(seq) - 1)
        if best >= min_tokens:
            out.add(seq[:best])
    return out


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
