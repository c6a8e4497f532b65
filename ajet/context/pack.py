"""Tree packing: samples that share token prefixes are forwarded as one token tree.

All samples of a batch (across episodes: GRPO siblings share their prompt) are
inserted into a trie over token ids. Each distinct trie node is one position of a
packed sequence; its `position_ids` value is its depth and `parents` points at
its parent's position, so a tree attention mask (token attends to its ancestors)
reproduces every sample's own causal forward. A trained token of a sample becomes
a *loss entry*: the position whose logits predict it (its parent) plus the token,
rollout logprob, advantage, weight and sample index. A node trained by two
samples keeps two entries, so nothing is lost by sharing.

Nodes are laid out in depth-first pre-order, so a parent always precedes its
children and every subtree is a contiguous range (`packed_forward` relies on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ajet.context.loss_weights import loss_weights
from ajet.context.types import Sample

__all__ = ["PackedSequence", "pack_samples", "pack_stats", "loss_weights"]


@dataclass
class PackedSequence:
    input_ids: list[int]
    position_ids: list[int]  # depth of the node in its tree
    parents: list[int]  # position of the parent node, -1 for a root
    entry_pos: list[int] = field(default_factory=list)  # position whose logits predict the token
    entry_token: list[int] = field(default_factory=list)
    entry_old_logprob: list[float] = field(default_factory=list)
    entry_advantage: list[float] = field(default_factory=list)
    entry_weight: list[float] = field(default_factory=list)
    entry_sample: list[int] = field(default_factory=list)  # index into the packed samples
    # The role of every sample in it when packed per role (`pack_samples(by_role=True)`, for
    # per-role LoRA adapters: the sequence is forwarded through its role's adapter); "" otherwise.
    role: str = ""

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_entries(self) -> int:
        return len(self.entry_pos)


class _Trie:
    def __init__(self) -> None:
        self.token: list[int] = []
        self.parent: list[int] = []
        self.children: list[dict[int, int]] = []
        self.roots: dict[int, int] = {}

    def insert(self, ids: list[int]) -> list[int]:
        """Insert a token sequence; return its node per token."""
        path: list[int] = []
        level = self.roots
        parent = -1
        for tok in ids:
            node = level.get(tok)
            if node is None:
                node = len(self.token)
                self.token.append(tok)
                self.parent.append(parent)
                self.children.append({})
                level[tok] = node
            path.append(node)
            parent, level = node, self.children[node]
        return path

    def preorder(self, root: int) -> list[int]:
        out, stack = [], [root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(list(self.children[node].values())))
        return out


def pack_samples(
    samples: list[Sample], weights: list[list[float]], max_tokens: int, *, by_role: bool = False
) -> list[PackedSequence]:
    """Pack samples into tree sequences of about `max_tokens` nodes at most.

    `by_role`: never put samples of two roles in one sequence (each role's samples are packed
    on their own and the sequences carry `role`), for per-role LoRA adapters, where a forward
    goes through one role's adapter. Prefixes shared across roles are then forwarded per role.

    Each prefix tree is one item; items are placed first-fit in decreasing size. A
    tree larger than `max_tokens` is first cut into groups of whole samples taken in
    depth-first order, each group with at most `max_tokens` distinct nodes (a trunk
    shared by two groups is then forwarded once per group). A single sample longer
    than `max_tokens` gets a sequence of its own. So tokens packed == distinct tokens
    unless a tree had to be cut. `max_tokens <= 0` disables tree packing: each sample
    is forwarded alone as a plain causal sequence, nothing shared.
    """
    if len(weights) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(weights)} weight rows")
    if by_role:
        return _pack_by_role(samples, weights, max_tokens)
    if max_tokens <= 0:
        return [_pack([s], [w], [i]) for i, (s, w) in enumerate(zip(samples, weights, strict=True))]
    trie = _Trie()
    by_root: dict[int, list[int]] = {}
    nodes_of: dict[int, set[int]] = {}
    for i, sample in enumerate(samples):
        path = trie.insert(sample.input_ids)
        if path:
            by_root.setdefault(path[0], []).append(i)
            nodes_of.setdefault(path[0], set()).update(path)
    items: list[tuple[int, list[int]]] = []  # (distinct nodes, sample indices)
    for root, idx in by_root.items():
        size = len(nodes_of[root])
        if size <= max_tokens:
            items.append((size, idx))
        else:
            items.extend(_cut_tree(samples, idx, max_tokens))
    bins: list[list[int]] = []
    used: list[int] = []
    for size, idx in sorted(items, key=lambda item: (-item[0], item[1][0])):
        slot = next((b for b, n in enumerate(used) if n + size <= max_tokens), None)
        if slot is None:
            bins.append(list(idx))
            used.append(size)
        else:
            bins[slot].extend(idx)
            used[slot] += size
    out = []
    for idx in bins:
        idx = sorted(idx)
        out.append(_pack([samples[i] for i in idx], [weights[i] for i in idx], idx))
    return out


def _pack_by_role(samples: list[Sample], weights: list[list[float]], max_tokens: int) -> list[PackedSequence]:
    """Each role's samples packed on their own (roles in first-seen order); `entry_sample`
    still indexes `samples`."""
    by_role: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        by_role.setdefault(sample.role, []).append(i)
    out: list[PackedSequence] = []
    for role, idx in by_role.items():
        for seq in pack_samples([samples[i] for i in idx], [weights[i] for i in idx], max_tokens):
            seq.entry_sample = [idx[j] for j in seq.entry_sample]
            seq.role = role
            out.append(seq)
    return out


def _cut_tree(
    samples: list[Sample], idx: list[int], max_tokens: int
) -> list[tuple[int, list[int]]]:
    """Groups of whole samples of one tree, each with at most `max_tokens` distinct nodes.

    In lexicographic (= depth-first) order, a sample adds exactly the tokens past its
    common prefix with the sample before it.
    """
    order = sorted(idx, key=lambda i: samples[i].input_ids)
    groups: list[tuple[int, list[int]]] = []
    group: list[int] = []
    size = 0
    prev: list[int] = []
    for i in order:
        ids = samples[i].input_ids
        added = len(ids) - _common_prefix(prev, ids) if group else len(ids)
        if group and size + added > max_tokens:
            groups.append((size, group))
            group, size, added = [], 0, len(ids)
        group.append(i)
        size += added
        prev = ids
    if group:
        groups.append((size, group))
    return groups


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


def _pack(samples: list[Sample], weights: list[list[float]], indices: list[int]) -> PackedSequence:
    trie = _Trie()
    paths = [trie.insert(s.input_ids) for s in samples]
    nodes = [node for root in trie.roots.values() for node in trie.preorder(root)]
    return _layout(trie, nodes, samples, paths, weights, indices)


def _layout(
    trie: _Trie,
    nodes: list[int],
    samples: list[Sample],
    paths: list[list[int]],
    weights: list[list[float]],
    indices: list[int],
) -> PackedSequence:
    at = {node: pos for pos, node in enumerate(nodes)}
    parents = [at[trie.parent[n]] if trie.parent[n] >= 0 else -1 for n in nodes]
    depth: list[int] = []
    for p in parents:
        depth.append(depth[p] + 1 if p >= 0 else 0)
    seq = PackedSequence(
        input_ids=[trie.token[n] for n in nodes], position_ids=depth, parents=parents
    )
    for sample, path, w, index in zip(samples, paths, weights, indices, strict=True):
        _check(sample, w, index)
        if sample.loss_mask and sample.loss_mask[0]:
            raise ValueError(
                f"sample {index}: its first token is marked trained but nothing predicts it"
            )
        adv = sample.advantage or [0.0] * len(sample.input_ids)
        for t in range(1, len(path)):
            if sample.loss_mask[t]:
                seq.entry_pos.append(at[path[t - 1]])
                seq.entry_token.append(sample.input_ids[t])
                seq.entry_old_logprob.append(float(sample.old_logprobs[t]))
                seq.entry_advantage.append(float(adv[t]))
                seq.entry_weight.append(float(w[t]))
                seq.entry_sample.append(index)
    return seq


def _check(sample: Sample, w: list[float], index: int) -> None:
    n = len(sample.input_ids)
    lengths = {
        "loss_mask": len(sample.loss_mask),
        "old_logprobs": len(sample.old_logprobs),
        "weights": len(w),
    }
    if sample.advantage:
        lengths["advantage"] = len(sample.advantage)
    bad = {k: v for k, v in lengths.items() if v != n}
    if bad:
        raise ValueError(
            f"sample {index} has {n} tokens but per-token lists of other lengths: {bad}"
        )


def pack_stats(samples: list[Sample], packed: list[PackedSequence]) -> dict[str, float]:
    """What merging and packing saved, in tokens forwarded.

    - tokens_per_call: tokens forwarded with one sample per trained call (each call's
      prompt + completion; calls are found through `token_call_ids`, else one per sample)
    - tokens_merged: tokens of the merged samples
    - tokens_packed: tokens of the packed sequences
    - tokens_distinct: distinct prefix-tree nodes over all samples (the ideal; equal to
      tokens_packed unless a tree larger than the packing budget had to be cut)
    - merge_ratio: tokens_per_call / tokens_packed
    """
    per_call = 0
    for s in samples:
        ends: dict[int, int] = {}
        for t, (m, c) in enumerate(
            zip(s.loss_mask, s.token_call_ids or [0] * len(s.input_ids), strict=True)
        ):
            if m:
                ends[c] = t + 1
        per_call += sum(ends.values())
    trie = _Trie()
    for s in samples:
        trie.insert(s.input_ids)
    merged = sum(len(s.input_ids) for s in samples)
    tokens_packed = sum(p.num_tokens for p in packed)
    return {
        "tokens_per_call": float(per_call),
        "tokens_merged": float(merged),
        "tokens_packed": float(tokens_packed),
        "tokens_distinct": float(len(trie.token)),
        "merge_ratio": per_call / tokens_packed if tokens_packed else 0.0,
    }
