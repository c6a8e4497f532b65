"""Shared-prefix (cascade) forwards of a packed tree == one forward under the 4-D tree mask."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import tiny_llama

from ajet.config.schema import LossAgg
from ajet.context.loss_weights import loss_weights
from ajet.context.pack import pack_samples
from ajet.context.types import Sample
from ajet.forward.cascade import Piece, plan_pieces
from ajet.forward.packed import forward_packed
from ajet.forward.tree_mask import subtree_ends


def tree_samples(seed: int = 0) -> list[Sample]:
    """A shared prompt, siblings that fork at several depths (one nested fork), a second
    tree with its own root, and a sample that is a prefix of another."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(1, 64) for _ in range(n)]

    prompt = [1] + toks(20)
    opening = toks(5)
    seqs = [
        prompt + toks(30),
        prompt + opening + toks(25),
        prompt + opening + toks(12),
        prompt + opening[:2] + toks(9),
        [2] + toks(40),
        [2] + toks(3),
    ]
    seqs.append(seqs[0][:30])
    out = []
    for i, ids in enumerate(seqs):
        mask = [0] + [1] * (len(ids) - 1)
        adv = [rng.uniform(-1, 1)] * len(ids)
        old = [rng.uniform(-3, -1) for _ in ids]
        out.append(
            Sample(input_ids=ids, loss_mask=mask, old_logprobs=old, advantage=adv, episode_id=f"e{i}")
        )
    return out


def packed_one():
    s = tree_samples()
    (packed,) = pack_samples(s, loss_weights(s, LossAgg.token_mean), 10_000)
    return packed


def test_plan_cuts_at_branch_points_and_separates_trees():
    # 0-1-2 trunk, then children 3 (-4) and 5; a second tree 6-7.
    parents = [-1, 0, 1, 2, 3, 2, -1, 6]
    ends = subtree_ends(parents)
    assert plan_pieces(parents, ends, split="always") == [
        Piece(0, 3, (Piece(3, 5), Piece(5, 6))),
        Piece(6, 8),
    ]
    assert plan_pieces(parents, ends, split="never") == [Piece(0, 8)]


def test_cost_model_splits_long_branches_and_keeps_tiny_trees_whole():
    # A 5-token trunk under three 500-token branches: split (attention 3 x 500^2, not 1505^2).
    parents = [-1, 0, 1, 2, 3]
    for _ in range(3):
        parents += [4] + [len(parents) + k for k in range(499)]
    pieces = plan_pieces(parents, subtree_ends(parents))
    assert len(pieces) == 1 and len(pieces[0].children) == 3
    # Forty 3-token trees: one forward beats forty.
    parents = [p for k in range(40) for p in (-1, 3 * k, 3 * k + 1)]
    assert plan_pieces(parents, subtree_ends(parents)) == [Piece(0, 120)]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_cascade_logprobs_and_entropy_equal_the_masked_forward(attn):
    model = tiny_llama(attn).eval()
    packed = packed_one()
    with torch.no_grad():
        want, want_h = forward_packed(model, packed, with_entropy=True, temperature=0.7, split="never")
        got, got_h = forward_packed(model, packed, with_entropy=True, temperature=0.7, split="always")
    assert got.shape == (packed.num_entries,)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=0)


def test_cascade_gradients_equal_the_masked_forward():
    packed = packed_one()
    grads = {}
    for split in ("never", "always"):
        model = tiny_llama().train()
        new, _ = forward_packed(model, packed, split=split)
        adv = torch.tensor(packed.entry_advantage)
        (-(new * adv).sum()).backward()
        grads[split] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads["never"].items():
        torch.testing.assert_close(grads["always"][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_cascade_under_gradient_checkpointing_equals_the_masked_forward():
    # The layout reaches every layer as a keyword, also through checkpointed layers.
    packed = packed_one()
    grads = {}
    for split in ("never", "always"):
        model = tiny_llama().train()
        model.gradient_checkpointing_enable()  # the name transformers 5 still takes
        new, _ = forward_packed(model, packed, split=split)
        (-(new * torch.tensor(packed.entry_advantage)).sum()).backward()
        grads[split] = (new.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(grads["always"][0], grads["never"][0], atol=1e-5, rtol=0)
    for name, g in grads["never"][1].items():
        torch.testing.assert_close(grads["always"][1][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_a_trunk_without_trained_tokens():
    # Only the last 5 tokens of each sample are trained: the shared trunk (and the
    # forwards inside it) predict nothing, and must still pass their keys and values on.
    s = tree_samples()
    for sample in s[:4]:
        n = len(sample.input_ids)
        sample.loss_mask = [0] * (n - 5) + [1] * 5
    (packed,) = pack_samples(s, loss_weights(s, LossAgg.token_mean), 10_000)
    model = tiny_llama().eval()
    with torch.no_grad():
        want, _ = forward_packed(model, packed, split="never")
        got, _ = forward_packed(model, packed, split="always")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("split", ["always", "never"])
def test_cascade_with_chunked_logits_equals_the_plain_masked_forward(split):
    # `logits_chunk` (trainer.logits_chunk_tokens) feeds each piece's hidden states to the LM
    # head a few entries at a time: same log-probs, entropies and gradients.
    packed = packed_one()
    results = {}
    for name, kwargs in (("plain", {"split": "never"}), ("chunked", {"split": split, "logits_chunk": 7})):
        model = tiny_llama().train()
        new, entropy = forward_packed(model, packed, with_entropy=True, temperature=0.7, **kwargs)
        (-(new * torch.tensor(packed.entry_advantage)).sum()).backward()
        results[name] = (new.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (want, want_h, want_g), (got, got_h, got_g) = results["plain"], results["chunked"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=0)
    for name, g in want_g.items():
        torch.testing.assert_close(got_g[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_layout_picks_causal_recompute_or_mask_by_the_past():
    from ajet.forward.tree_attention import tree_layout

    # Trunk 0-3 (4 tokens); a 10-token branch (past 4 < 10: causal over trunk + branch,
    # one merged key range) and a 2-token branch (past 4 >= 2: masked against the trunk).
    parents = [-1, 0, 1, 2, 3] + list(range(4, 13)) + [3, 14]
    pieces = plan_pieces(parents, subtree_ends(parents), split="always")
    trunk, long_branch, short_branch = tree_layout(pieces, parents, "cpu").segments
    assert (trunk.start, trunk.stop, trunk.keys, trunk.mask) == (0, 4, ((0, 4),), None)
    assert (long_branch.keys, long_branch.mask) == (((0, 14),), None)
    assert short_branch.keys == ((0, 4), (14, 16))
    assert short_branch.mask[0, 0].tolist() == [[True] * 5 + [False], [True] * 6]


def test_installed_tree_attention_leaves_ordinary_forwards_alone():
    # The engine shares the trainer's model: after a tree-packed forward switched it to tree
    # attention, a padded batch (2-D mask) must give the same logits as before.
    model = tiny_llama().eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 3, 4, 5]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=attn).logits
        forward_packed(model, packed_one(), split="always")
        assert model.config._attn_implementation == "ajet_tree_sdpa"
        got = model(input_ids=ids, attention_mask=attn).logits
    torch.testing.assert_close(got[attn.bool()], want[attn.bool()], atol=1e-6, rtol=0)
