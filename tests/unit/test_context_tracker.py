"""ContextTracker: prompts by extension, fork causes, timelines (fake character-level ChatML)."""

from __future__ import annotations

import logging
import threading

import pytest
from test_context_fakes import IM_END, CharChatML, LatestMarkChatML, make_tracker

from ajet.context.merge import merge_timelines, timelines_to_samples
from ajet.context.types import LLMCall

SYS = {"role": "system", "content": "You solve tasks with tools."}
USER = {"role": "user", "content": "What is 6*7?"}


def asst(text: str) -> dict:
    return {"role": "assistant", "content": text}


def tool(text: str) -> dict:
    return {"role": "tool", "content": text, "tool_call_id": "c1"}


def react(agent, turns: int, role: str = "default"):
    messages = [SYS, USER]
    calls = []
    for i in range(turns):
        call = agent.call(role, messages, f"step {i}")
        calls.append(call)
        messages = messages + [asst(f"step {i}"), tool(f"obs {i}")]
    return calls, messages


def test_linear_react_extends_one_timeline_with_exact_tokens():
    tracker, agent = make_tracker()
    r = agent.renderer
    calls, messages = react(agent, 3)
    for prev, call in zip(calls, calls[1:], strict=False):
        assert (
            call.prompt_ids[: len(prev.prompt_ids) + len(prev.completion_ids)]
            == prev.prompt_ids + prev.completion_ids
        )
        # The char tokenizer is canonical: the extension equals re-tokenizing the full render.
        assert call.prompt_ids == r.encode(r.render(call.messages))
    assert [c.timeline_id for c in calls] == [0, 0, 0]
    assert [c.fork_cause for c in calls] == ["first_call", "", ""]
    assert [c.call_index for c in calls] == [0, 1, 2]
    (tl,) = tracker.timelines()
    last = calls[-1]
    assert tl.token_ids == last.prompt_ids + last.completion_ids
    assert tl.call_indices == [0, 1, 2]
    trained = [i for i, t in enumerate(tl.trainable) if t]
    expected = [
        i
        for c in calls
        for i in range(len(c.prompt_ids), len(c.prompt_ids) + len(c.completion_ids))
    ]
    assert trained == expected
    for c, (start, end) in zip(calls, tl.completion_spans, strict=False):
        assert tl.token_ids[start:end] == c.completion_ids
        assert tl.logprobs[start:end] == c.completion_logprobs
    assert tracker.stats() == {"calls": 3.0, "timelines": 1.0, "fork/first_call": 1.0}
    (sample,) = timelines_to_samples(
        merge_timelines(tracker.timelines()), episode_id="e", group_id="g", reward=1.0
    )
    assert sum(sample.loss_mask) == sum(len(c.completion_ids) for c in calls)
    assert sample.num_calls == 3


def test_reply_sent_back_in_other_shapes_still_extends():
    tracker, agent = make_tracker()
    tool_call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calc", "arguments": '{"x": 6, "y": 7}'},
    }
    received = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
    # The model wrote the call with other spacing than the template renders: the
    # tokens differ from the rendered text, but the agent returns what it received.
    first = agent.call(
        "default",
        [SYS, USER],
        "",
        completion_text='<tool_call>{"name":"calc","arguments":{"x":6,"y":7}}</tool_call>',
        response=received,
    )
    echoed = {
        "role": "assistant",
        "content": "",
        "name": "solver",
        "refusal": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calc", "arguments": {"y": 7, "x": 6}},
            }
        ],
    }
    second = agent.call("default", [SYS, USER, echoed, tool("42")], "It is 42.")
    assert second.fork_cause == "" and second.timeline_id == first.timeline_id
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
        == first.prompt_ids + first.completion_ids
    )
    blocks = {"role": "assistant", "content": [{"type": "text", "text": "It is 42."}], "id": "m2"}
    third = agent.call(
        "default", [SYS, USER, echoed, tool("42"), blocks, {"role": "user", "content": "ok"}], "bye"
    )
    assert third.fork_cause == "" and len(tracker.timelines()) == 1


def test_stripped_whitespace_reply_still_extends():
    tracker, agent = make_tracker()
    first = agent.call(
        "default", [SYS, USER], "  42\n", response={"role": "assistant", "content": "  42\n"}
    )
    second = agent.call(
        "default", [SYS, USER, asst("42"), {"role": "user", "content": "sure?"}], "yes"
    )
    assert second.fork_cause == "" and second.timeline_id == first.timeline_id


def test_length_cut_completion_gets_the_eos_as_untrained_context():
    tracker, agent = make_tracker()
    r = agent.renderer
    first = agent.call("default", [SYS, USER], "The answer i", eos=False)
    assert IM_END not in first.completion_ids
    second = agent.call(
        "default", [SYS, USER, asst("The answer i"), {"role": "user", "content": "go on"}], "s 42"
    )
    n = len(first.prompt_ids) + len(first.completion_ids)
    assert second.fork_cause == ""
    assert second.prompt_ids[n] == IM_END  # the end-of-turn the template appends
    assert second.prompt_ids == r.encode(r.render(second.messages))
    (tl,) = tracker.timelines()
    assert tl.trainable[n] is False and tl.trainable[n - 1] is True


def test_retry_reuses_the_prompt_and_trains_the_trunk_once():
    tracker, agent = make_tracker()
    c0 = agent.call("default", [SYS, USER], "look up")
    history = [SYS, USER, asst("look up"), tool("data")]
    c1 = agent.call("default", history, "answer A")
    c2 = agent.call("default", history, "answer B")  # the agent retries the same state
    assert c2.fork_cause == "retry" and c2.prompt_ids == c1.prompt_ids
    c3 = agent.call(
        "default", history + [asst("answer B"), {"role": "user", "content": "more"}], "done"
    )
    assert c3.fork_cause == "" and c3.timeline_id == c2.timeline_id
    t0, t1 = tracker.timelines()
    assert (t0.call_indices, t1.call_indices) == ([0, 1], [2, 3])
    c0_span = range(len(c0.prompt_ids), len(c0.prompt_ids) + len(c0.completion_ids))
    assert all(t0.trainable[i] for i in c0_span)
    assert not any(t1.trainable[i] for i in c0_span)  # the trunk is context in the retry
    samples = timelines_to_samples(
        merge_timelines([t0, t1]), episode_id="e", group_id="g", reward=0.0
    )
    assert len(samples) == 2
    trained = sum(sum(s.loss_mask) for s in samples)
    assert trained == sum(len(c.completion_ids) for c in (c0, c1, c2, c3))
    assert tracker.stats()["fork/retry"] == 1.0


def test_two_calls_from_one_state_branch():
    tracker, agent = make_tracker()
    c0 = agent.call("default", [SYS, USER], "plan")
    c1 = agent.call("default", [SYS, USER, asst("plan"), tool("a")], "x")
    c2 = agent.call("default", [SYS, USER, asst("plan"), tool("b")], "y")
    assert (c1.fork_cause, c2.fork_cause) == ("", "branch")
    assert (
        c2.prompt_ids[: len(c0.prompt_ids) + len(c0.completion_ids)]
        == c0.prompt_ids + c0.completion_ids
    )
    assert [t.call_indices for t in tracker.timelines()] == [[0, 1], [2]]


def test_history_rewrite_starts_a_new_timeline():
    tracker, agent = make_tracker()
    r = agent.renderer
    react(agent, 2)
    summary = [SYS, {"role": "user", "content": "Summary: tried twice. Go on."}]
    call = agent.call("default", summary, "ok")
    assert call.fork_cause == "history_rewritten" and call.timeline_id == 1
    assert call.prompt_ids == r.encode(r.render(summary))
    assert (
        len(
            timelines_to_samples(
                merge_timelines(tracker.timelines()), episode_id="e", group_id="g", reward=0
            )
        )
        == 2
    )


def test_edited_reply_is_a_mismatch_but_reuses_the_prompt():
    tracker, agent = make_tracker()
    c0 = agent.call("default", [SYS, USER], "forty two")
    c1 = agent.call(
        "default", [SYS, USER, asst("42 (edited)"), {"role": "user", "content": "ok"}], "fine"
    )
    assert c1.fork_cause == "reply_mismatch" and c1.timeline_id == 1
    assert c1.prompt_ids[: len(c0.prompt_ids)] == c0.prompt_ids
    (sample_a, sample_b) = timelines_to_samples(
        tracker.timelines(), episode_id="e", group_id="g", reward=0
    )
    assert sum(sample_b.loss_mask) == len(c1.completion_ids)


def test_tools_changed():
    tracker, agent = make_tracker()
    tools = [{"type": "function", "function": {"name": "calc"}}]
    agent.call("default", [SYS, USER], "a", tools=tools)
    call = agent.call(
        "default", [SYS, USER, asst("a"), {"role": "user", "content": "b"}], "c", tools=tools[:0]
    )
    assert call.fork_cause == "tools_changed"


def test_two_agents_get_one_timeline_each_and_non_trainable_role_is_context():
    tracker, agent = make_tracker(roles={"alice"})
    views = {"alice": [SYS, USER], "bob": [SYS, USER]}
    calls = []
    for turn in range(3):
        for role, other in (("alice", "bob"), ("bob", "alice")):
            text = f"{role} says {turn}"
            calls.append(agent.call(role, views[role], text))
            views[role] = views[role] + [asst(text)]
            views[other] = views[other] + [{"role": "user", "content": f"{role}: {text}"}]
    assert [c.fork_cause for c in calls[:2]] == ["first_call", "other_role"]
    assert all(c.fork_cause == "" for c in calls[2:])
    assert [c.trainable for c in calls] == [True, False] * 3
    timelines = merge_timelines(tracker.timelines())
    assert sorted(t.role for t in timelines) == ["alice", "bob"]
    bob = next(t for t in timelines if t.role == "bob")
    assert not any(bob.trainable)
    samples = timelines_to_samples(timelines, episode_id="e", group_id="g", reward=1.0)
    assert [s.role for s in samples] == ["alice"]
    kept = timelines_to_samples(
        timelines, episode_id="e", group_id="g", reward=1.0, drop_untrained=False
    )
    assert sorted(s.role for s in kept) == ["alice", "bob"]
    assert sum(next(s for s in kept if s.role == "bob").loss_mask) == 0


def test_template_not_prefix_preserving_forks_and_warns(caplog):
    tracker, agent = make_tracker(renderer=LatestMarkChatML())
    with caplog.at_level(logging.WARNING, logger="ajet.context.diagnostics"):
        first = agent.call("default", [SYS, USER], "a")
        second = agent.call(
            "default", [SYS, USER, asst("a"), {"role": "user", "content": "b"}], "c"
        )
    assert first.fork_cause == "first_call"
    assert second.fork_cause == "template_not_prefix_preserving" and second.timeline_id == 1
    assert any("not prefix-preserving" in rec.message for rec in caplog.records)


def test_prompt_not_built_by_the_tracker_is_matched_by_tokens():
    tracker, agent = make_tracker()
    c0 = agent.call("default", [SYS, USER], "hi")
    ids = c0.prompt_ids + c0.completion_ids + [50, 51]
    call = LLMCall(
        role="default",
        prompt_ids=ids,
        completion_ids=[60, IM_END],
        completion_logprobs=[-1.0, -2.0],
        finish_reason="stop",
        policy_version=0,
    )
    tracker.record(call)
    assert call.timeline_id == 0 and call.fork_cause == ""
    orphan = LLMCall(
        role="default",
        prompt_ids=[70, 71],
        completion_ids=[IM_END],
        completion_logprobs=[-1.0],
        finish_reason="stop",
        policy_version=0,
    )
    tracker.record(orphan)
    assert orphan.fork_cause == "untracked_prompt" and orphan.timeline_id == 1


def test_logprob_count_must_match():
    tracker, _ = make_tracker()
    bad = LLMCall(
        role="default",
        prompt_ids=[5],
        completion_ids=[6, 7],
        completion_logprobs=[-1.0],
        finish_reason="stop",
        policy_version=0,
    )
    with pytest.raises(ValueError, match="one logprob per token"):
        tracker.record(bad)


def test_concurrent_roles_from_threads():
    tracker, agent = make_tracker()
    errors: list[BaseException] = []

    def run(role: str) -> None:
        try:
            react(agent, 4, role=role)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"r{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(tracker.calls) == 24 and len(tracker.timelines()) == 6
    assert sorted(c.call_index for c in tracker.calls) == list(range(24))


def test_all_roles_trainable_by_default():
    tracker, agent = make_tracker(renderer=CharChatML())
    call = agent.call("anyone", [USER], "x")
    assert call.trainable


def test_concurrent_first_calls_are_told_apart():
    tracker, agent = make_tracker()
    r = agent.renderer
    # Both prompts are built before either call is recorded (calls in flight together).
    prompts = [tracker.build_prompt("default", [SYS, USER], None) for _ in range(2)]
    other = tracker.build_prompt("default", [SYS, {"role": "user", "content": "Other?"}], None)
    causes = []
    for ids in prompts + [other]:
        call = LLMCall(
            role="default",
            prompt_ids=ids,
            completion_ids=r.encode("x") + [IM_END],
            completion_logprobs=[-1.0, -1.0],
            finish_reason="stop",
            policy_version=0,
            messages=[SYS, USER],
        )
        tracker.record(call)
        causes.append(call.fork_cause)
    assert causes == ["first_call", "retry", "concurrent_call"]
