"""Tree packing and loss weights: the same loss from per-call, merged and packed data."""

from __future__ import annotations

import math

import pytest
from test_context_fakes import make_tracker

from ajet.config.schema import LossAgg
from ajet.context.loss_weights import loss_weights
from ajet.context.merge import merge_timelines, per_call_samples, timelines_to_samples
from ajet.context.pack import pack_samples, pack_stats
from ajet.context.types import Sample

SYS = {"role": "system", "content": "Solve it."}


def asst(text: str) -> dict:
    return {"role": "assistant", "content": text}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def episode_linear(agent, q: str):
    m = [SYS, user(q)]
    for i in range(3):
        agent.call("default", m, f"think {i}{q}")
        m = m + [asst(f"think {i}{q}"), {"role": "tool", "content": f"r{i}"}]


def episode_retry(agent, q: str):
    agent.call("default", [SYS, user(q)], "first")
    h = [SYS, user(q), asst("first"), user("again")]
    agent.call("default", h, "try one, longer")
    agent.call("default", h, "try two")


def episode_agents(agent, q: str):
    a, b = [SYS, user(q)], [SYS, user(q + "?")]
    for i in range(2):
        agent.call("alice", a, f"a{i}")
        a = a + [asst(f"a{i}"), user(f"bob said b{i}")]
        agent.call("bob", b, f"b{i}")
        b = b + [asst(f"b{i}"), user(f"alice said a{i}")]


def build_batch():
    """Episodes of several shapes, GRPO-style: two episodes per task share the prompt."""
    per_call, merged = [], []
    builders = [episode_linear, episode_linear, episode_retry, episode_agents]
    for e, build in enumerate(builders):
        tracker, agent = make_tracker()
        build(agent, "task" if e < 2 else f"task{e}")
        eid = f"ep{e}"
        per_call += per_call_samples(tracker.calls, episode_id=eid, group_id="g", reward=1.0)
        merged += timelines_to_samples(
            merge_timelines(tracker.timelines()), episode_id=eid, group_id="g", reward=1.0
        )
    for samples in (per_call, merged):
        for s in samples:  # an advantage per episode, as GRPO would give
            s.advantage = [float(s.episode_id[-1]) - 1.5] * len(s.input_ids)
    return per_call, merged


def token_loss(episode: str, old_logprob: float) -> float:
    """A per-token 'loss' that depends only on which token of which call it is."""
    return math.sin(1000 * old_logprob + 7 * int(episode[-1]))


def total(samples: list[Sample], weights: list[list[float]]) -> float:
    return sum(
        w * token_loss(s.episode_id, lp)
        for s, ws in zip(samples, weights, strict=False)
        for m, w, lp in zip(s.loss_mask, ws, s.old_logprobs, strict=False)
        if m
    )


def packed_total(samples, packed) -> float:
    return sum(
        w * token_loss(samples[i].episode_id, lp)
        for p in packed
        for w, lp, i in zip(p.entry_weight, p.entry_old_logprob, p.entry_sample, strict=False)
    )


@pytest.mark.parametrize("mode", list(LossAgg))
def test_loss_is_identical_per_call_merged_and_packed(mode):
    per_call, merged = build_batch()
    assert len(merged) < len(per_call)
    w_call = loss_weights(per_call, mode)
    w_merged = loss_weights(merged, mode)
    expected = total(per_call, w_call)
    assert total(merged, w_merged) == pytest.approx(expected, rel=1e-12)
    for max_tokens in (0, 64, 100_000):
        packed = pack_samples(merged, w_merged, max_tokens)
        assert packed_total(merged, packed) == pytest.approx(expected, rel=1e-12)
    # Weights sum to 1 in every mode (a mean), whatever the layout.
    assert sum(map(sum, w_merged)) == pytest.approx(1.0)


def test_modes_weigh_differently():
    _, merged = build_batch()
    token = loss_weights(merged, LossAgg.token_mean)
    seq = loss_weights(merged, LossAgg.seq_mean)
    episode = loss_weights(merged, LossAgg.episode_mean)
    flat = [
        w
        for ws, s in zip(token, merged, strict=False)
        for w, m in zip(ws, s.loss_mask, strict=False)
        if m
    ]
    assert len(set(flat)) == 1  # token_mean: all equal
    # seq_mean: every call's weights sum to 1 / calls.
    calls: dict = {}
    for s, ws in zip(merged, seq, strict=False):
        for c, w in zip(s.token_call_ids, ws, strict=False):
            if c >= 0:
                calls[(s.episode_id, c)] = calls.get((s.episode_id, c), 0.0) + w
    assert all(v == pytest.approx(1 / len(calls)) for v in calls.values())
    per_episode: dict = {}
    for s, ws in zip(merged, episode, strict=False):
        per_episode[s.episode_id] = per_episode.get(s.episode_id, 0.0) + sum(ws)
    assert all(v == pytest.approx(1 / len(per_episode)) for v in per_episode.values())


def test_packed_tree_reproduces_every_sample():
    _, merged = build_batch()
    weights = loss_weights(merged, LossAgg.token_mean)
    packed = pack_samples(merged, weights, 100_000)
    stats = pack_stats(merged, packed)
    assert (
        stats["tokens_packed"]
        == stats["tokens_distinct"]
        < stats["tokens_merged"]
        < stats["tokens_per_call"]
    )
    (seq,) = packed
    for i, p in enumerate(seq.parents):
        assert p < i  # pre-order: a parent precedes its children
        assert seq.position_ids[i] == (seq.position_ids[p] + 1 if p >= 0 else 0)
    # Every entry's position holds the token before it, at the right depth.
    for sample_index, sample in enumerate(merged):
        entries = [e for e, s in enumerate(seq.entry_sample) if s == sample_index]
        trained = [t for t, m in enumerate(sample.loss_mask) if m]
        assert len(entries) == len(trained)
        for e, t in zip(entries, trained, strict=False):
            pos = seq.entry_pos[e]
            assert seq.entry_token[e] == sample.input_ids[t]
            assert seq.position_ids[pos] == t - 1
            # Walking the parents from pos spells the sample's prefix.
            path = []
            while pos >= 0:
                path.append(seq.input_ids[pos])
                pos = seq.parents[pos]
            assert path[::-1] == sample.input_ids[:t]
            assert seq.entry_advantage[e] == sample.advantage[t]


def test_grpo_siblings_share_the_prompt_and_keep_one_entry_each():
    prompt = [1, 2, 3, 4]
    samples = [
        Sample(
            input_ids=prompt + [9, 10],
            loss_mask=[0, 0, 0, 0, 1, 1],
            old_logprobs=[0] * 4 + [-0.1, -0.2],
            episode_id="a",
            token_call_ids=[-1] * 4 + [0, 0],
        ),
        Sample(
            input_ids=prompt + [9, 11],
            loss_mask=[0, 0, 0, 0, 1, 1],
            old_logprobs=[0] * 4 + [-0.1, -0.3],
            episode_id="b",
            token_call_ids=[-1] * 4 + [0, 0],
        ),
        Sample(
            input_ids=[7, 8, 9],
            loss_mask=[0, 1, 1],
            old_logprobs=[0, -0.5, -0.6],
            episode_id="c",
            token_call_ids=[-1, 0, 0],
        ),
    ]
    weights = loss_weights(samples, LossAgg.token_mean)
    packed = pack_samples(samples, weights, 100)
    (seq,) = packed
    assert seq.num_tokens == 4 + 1 + 2 + 3  # shared prompt, shared token 9, two leaves, other tree
    # Token 9 is one node trained by two samples: two entries at the same position.
    nine = [e for e, t in enumerate(seq.entry_token) if t == 9 and seq.entry_sample[e] in (0, 1)]
    assert len(nine) == 2 and len({seq.entry_pos[e] for e in nine}) == 1
    assert seq.num_entries == 6
    stats = pack_stats(samples, packed)
    assert stats["tokens_per_call"] == 6 + 6 + 3
    assert stats["tokens_distinct"] == 10 and stats["tokens_packed"] == 10


def test_bins_hold_whole_trees_and_big_trees_go_alone():
    def s(ids):
        return Sample(
            input_ids=ids, loss_mask=[0] + [1] * (len(ids) - 1), old_logprobs=[0.0] * len(ids)
        )

    samples = [s([1, 2, 3]), s([1, 2, 4]), s([5, 6]), s(list(range(10, 30))), s([7, 8])]
    weights = loss_weights(samples, LossAgg.token_mean)
    packed = pack_samples(samples, weights, 6)
    sizes = sorted(p.num_tokens for p in packed)
    # First-fit decreasing: the 20-token tree alone, {1,2,3,4}+{5,6}, then {7,8}.
    assert sizes == [2, 6, 20]
    for p in packed:  # no tree is split: every entry's sample lies wholly in one sequence
        assert all(samples[i].input_ids[0] in p.input_ids for i in p.entry_sample)
    assert sorted(i for p in packed for i in set(p.entry_sample)) == [0, 1, 2, 3, 4]
    unpacked = pack_samples(samples, weights, 0)
    assert [p.num_tokens for p in unpacked] == [3, 3, 2, 20, 2]


def test_trained_first_token_is_rejected():
    bad = Sample(input_ids=[1, 2], loss_mask=[1, 1], old_logprobs=[0.0, 0.0])
    with pytest.raises(ValueError, match="first token"):
        pack_samples([bad], [[1.0, 1.0]], 10)


def test_length_mismatch_is_rejected():
    bad = Sample(input_ids=[1, 2, 3], loss_mask=[0, 1], old_logprobs=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        loss_weights([bad], LossAgg.token_mean)


def test_a_tree_larger_than_the_budget_is_cut_into_groups_of_whole_samples():
    prompt = list(range(100, 110))
    samples = [
        Sample(
            input_ids=prompt + [200 + k] * 5,
            loss_mask=[0] * 10 + [1] * 5,
            old_logprobs=[0.0] * 10 + [-0.1 * k] * 5,
            episode_id=f"e{k}",
        )
        for k in range(6)
    ]
    weights = loss_weights(samples, LossAgg.token_mean)
    packed = pack_samples(samples, weights, 25)
    # Greedy in depth-first order: 15 + 5 + 5 nodes per group, the prompt once per group.
    assert [p.num_tokens for p in packed] == [25, 25]
    assert sorted(i for p in packed for i in set(p.entry_sample)) == list(range(6))
    assert sum(p.num_entries for p in packed) == 30
    stats = pack_stats(samples, packed)
    assert (stats["tokens_packed"], stats["tokens_distinct"]) == (50, 40)
    # One sample longer than the budget goes alone.
    long = Sample(input_ids=list(range(40)), loss_mask=[0] + [1] * 39, old_logprobs=[0.0] * 40)
    alone = pack_samples([long], loss_weights([long], LossAgg.token_mean), 25)
    assert [p.num_tokens for p in alone] == [40]
