"""merge_timelines / timelines_to_samples on hand-built timelines with stated masks."""

from __future__ import annotations

from ajet.context.merge import merge_timelines, timelines_to_samples, token_calls
from ajet.context.types import Timeline


def timeline(
    tid: int,
    role: str,
    tokens: list[int],
    calls: dict[int, tuple[int, int]],
    trainable: bool = True,
) -> Timeline:
    """Tokens with the given call completion spans; logprob of token i is -i/100."""
    mask = [False] * len(tokens)
    logprobs = [0.0] * len(tokens)
    for start, end in calls.values():
        for i in range(start, end):
            mask[i] = trainable
            logprobs[i] = -i / 100
    return Timeline(tid, role, list(tokens), mask, logprobs, list(calls), list(calls.values()))


# A ReAct episode of 3 calls, given as one timeline per call (as a tracker without
# extension, or another backbone, would produce): prompt 0-3, completions at 4-5, 8-9, 12-13.
TOKENS = list(range(100, 114))
PER_CALL = [
    timeline(0, "default", TOKENS[:6], {0: (4, 6)}),
    timeline(1, "default", TOKENS[:10], {0: (4, 6), 1: (8, 10)}),
    timeline(2, "default", TOKENS[:14], {0: (4, 6), 1: (8, 10), 2: (12, 14)}),
]


def test_linear_react_n_calls_become_one_sample():
    merged = merge_timelines(PER_CALL)
    assert len(merged) == 1
    (sample,) = timelines_to_samples(merged, episode_id="e1", group_id="g", reward=0.5)
    assert sample.input_ids == TOKENS
    assert sample.loss_mask == [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    assert sample.token_call_ids == [-1] * 4 + [0, 0, -1, -1, 1, 1, -1, -1, 2, 2]
    assert sample.old_logprobs[12] == -0.12 and sample.old_logprobs[3] == 0.0
    assert sample.segments == [(4, 6), (8, 10), (12, 14)]
    assert (sample.num_calls, sample.episode_id, sample.group_id, sample.reward) == (
        3,
        "e1",
        "g",
        0.5,
    )


def test_merge_does_not_modify_its_inputs():
    before = [t.trainable[:] for t in PER_CALL]
    merge_timelines(PER_CALL)
    assert [t.trainable for t in PER_CALL] == before


def test_absorbed_timeline_keeps_its_trainable_tokens():
    # The longer timeline has call 0's tokens as context only (e.g. built by a branch).
    long = timeline(1, "default", TOKENS[:10], {1: (8, 10)})
    short = timeline(0, "default", TOKENS[:6], {0: (4, 6)})
    (merged,) = merge_timelines([short, long])
    assert token_calls(merged) == [-1] * 4 + [0, 0, -1, -1, 1, 1]
    assert merged.logprobs[4:6] == [-0.04, -0.05]
    assert merged.call_indices == [0, 1] and merged.completion_spans == [(4, 6), (8, 10)]


def test_retry_fork_trains_the_shared_trunk_once():
    # Call 0 at 4-5 is shared; calls 1 and 2 are two retries after it (different tokens).
    a = timeline(0, "default", TOKENS[:10], {0: (4, 6), 1: (8, 10)})
    b = timeline(1, "default", TOKENS[:8] + [200, 201], {0: (4, 6), 2: (8, 10)})
    merged = merge_timelines([a, b])
    assert len(merged) == 2
    s1, s2 = timelines_to_samples(merged, episode_id="e", group_id="g", reward=1.0)
    assert s1.loss_mask == [0, 0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert s2.loss_mask == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]  # the trunk is context here
    assert (s1.num_calls, s2.num_calls) == (2, 1)
    assert s2.segments == [(8, 10)]


def test_same_tokens_from_two_calls_are_not_merged_away():
    # Two calls sampled identical completions from the same prompt: both losses count.
    a = timeline(0, "default", TOKENS[:6], {0: (4, 6)})
    b = timeline(1, "default", TOKENS[:6], {1: (4, 6)})
    merged = merge_timelines([a, b])
    assert len(merged) == 2
    samples = timelines_to_samples(merged, episode_id="e", group_id="g", reward=1.0)
    assert [s.token_call_ids[4] for s in samples] == [0, 1]


def test_roles_are_merged_separately():
    a = timeline(0, "alice", TOKENS[:6], {0: (4, 6)})
    b = timeline(1, "bob", TOKENS[:10], {1: (8, 10)})
    merged = merge_timelines([a, b])
    assert [t.role for t in merged] == ["alice", "bob"]


def test_non_trainable_role_gives_context_only_tokens():
    ref = timeline(0, "referee", TOKENS[:10], {0: (4, 6), 1: (8, 10)}, trainable=False)
    player = timeline(1, "player", TOKENS[:6], {2: (4, 6)})
    merged = merge_timelines([ref, player])
    assert not any(merged[0].trainable)
    assert merged[0].logprobs[4] == -0.04  # rollout logprobs are kept for the record
    samples = timelines_to_samples(
        merged, episode_id="e", group_id="g", reward=1.0, drop_untrained=False
    )
    assert sum(samples[0].loss_mask) == 0 and samples[0].num_calls == 0
    assert [
        s.role for s in timelines_to_samples(merged, episode_id="e", group_id="g", reward=1.0)
    ] == ["player"]


def test_tree_of_timelines_per_role():
    # Three leaves of one role: two share a trunk with call 0, one is an extension of
    # another's prefix. Expected: the prefix is absorbed, two leaves remain.
    trunk = timeline(0, "default", TOKENS[:6], {0: (4, 6)})
    leaf1 = timeline(1, "default", TOKENS[:10], {0: (4, 6), 1: (8, 10)})
    leaf2 = timeline(2, "default", TOKENS[:6] + [300, 301, 302, 303], {0: (4, 6), 2: (8, 10)})
    merged = merge_timelines([trunk, leaf1, leaf2])
    assert [t.timeline_id for t in merged] == [1, 2]
    samples = timelines_to_samples(merged, episode_id="e", group_id="g", reward=1.0)
    total = sum(sum(s.loss_mask) for s in samples)
    assert total == 6  # calls 0, 1, 2: two tokens each, each trained once
