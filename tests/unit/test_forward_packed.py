"""Tree attention mask and one packed forward == separate forwards (tiny in-memory Llama)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

from ajet.config.schema import LossAgg
from ajet.context.loss_weights import loss_weights
from ajet.context.pack import PackedSequence, pack_samples
from ajet.context.types import Sample
from ajet.forward.packed import forward_packed, tree_attention_mask


def test_mask_is_ancestors_and_self():
    # 0 -> 1 -> 2, 0 -> 3, and a second root 4 -> 5
    parents = [-1, 0, 1, 0, -1, 4]
    mask = tree_attention_mask(parents, torch.float32)
    assert mask.shape == (1, 1, 6, 6)
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]
    assert mask[0, 0, 0, 1] == torch.finfo(torch.float32).min


def test_mask_without_preorder_layout():
    # Node 2's parent is 0 but node 1 (a root) sits between them: not pre-order.
    allowed = (tree_attention_mask([-1, -1, 0, 2], torch.float32)[0, 0] == 0).int().tolist()
    assert allowed == [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]


SEQS = [
    [5, 6, 7, 8, 9, 10, 11],
    [5, 6, 7, 8, 12, 13],
    [5, 6, 7, 8, 9, 14, 15, 16],
    [20, 21, 22, 23],
]


def samples() -> list[Sample]:
    out = []
    for i, ids in enumerate(SEQS):
        mask = [0] * 4 + [1] * (len(ids) - 4)
        out.append(
            Sample(input_ids=ids, loss_mask=mask, old_logprobs=[0.0] * len(ids), episode_id=f"e{i}")
        )
    return out


def separate_logprobs(model, temperature: float = 1.0) -> list[float]:
    out = []
    with torch.no_grad():
        for ids in SEQS:
            logits = model(torch.tensor([ids])).logits[0] / temperature
            logp = torch.log_softmax(logits.float(), -1)
            out += [float(logp[t - 1, ids[t]]) for t in range(4, len(ids))]
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_equals_separate_forwards(attn):
    model = tiny_llama(attn)
    s = samples()
    (packed,) = pack_samples(s, loss_weights(s, LossAgg.token_mean), 1000)
    assert packed.num_tokens < sum(map(len, SEQS))
    with torch.no_grad():
        got, entropy = forward_packed(model, packed, with_entropy=True, temperature=0.7)
    # Entries are grouped by sample, in token order: the same order as separate_logprobs.
    expected = torch.tensor(separate_logprobs(model, temperature=0.7))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert entropy is not None and entropy.shape == got.shape and bool((entropy > 0).all())


def test_single_chain_uses_the_causal_path():
    model = tiny_llama("sdpa")
    ids = SEQS[0]
    packed = PackedSequence(
        input_ids=ids,
        position_ids=list(range(len(ids))),
        parents=list(range(-1, len(ids) - 1)),
        entry_pos=[3, 4],
        entry_token=[ids[4], ids[5]],
    )
    with torch.no_grad():
        got, entropy = forward_packed(model, packed)
    assert entropy is None
    torch.testing.assert_close(got, torch.tensor(separate_logprobs(model)[:2]), atol=1e-5, rtol=0)


def test_unsupported_attention_is_an_error():
    model = tiny_llama("sdpa")
    model.config._attn_implementation = "flash_attention_2"
    s = samples()
    (packed,) = pack_samples(s, loss_weights(s, LossAgg.token_mean), 1000)
    with pytest.raises(ValueError, match="attn_implementation"):
        forward_packed(model, packed)
