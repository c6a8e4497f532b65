"""An agent that compacts its memory (issue 55 §3): a summary call replaces the earlier turns.

- the summary call is a policy turn: its tokens are trained, in the sample of the turns it
  summarises;
- the turns after the rewrite are a new sample that starts from the rewritten prompt;
- the episode's reward and advantage reach every sample;
- nothing is trained twice;
- each sample after the first names its break (merge.BREAKS): "rewrite" here; "truncation",
  "template", "split" elsewhere.
"""

from __future__ import annotations

from test_context_fakes import make_tracker

from ajet.algorithms.advantages import assign_token_advantages
from ajet.config.schema import ContextConfig, OverflowPolicy
from ajet.context.budget import apply_budget
from ajet.context.merge import BREAKS, break_of, merge_timelines, timelines_to_samples
from ajet.context.tracker import FORK_CAUSES
from ajet.outputs.viewer import page_record

SYS = {"role": "system", "content": "Walk to G."}
TASK = {"role": "user", "content": "Map: SFG. Your move?"}
SUMMARISE = {"role": "user", "content": "Your notes are full. Summarise them in one line."}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def asst(text: str) -> dict:
    return {"role": "assistant", "content": text}


def compacting_episode(agent):
    """Two moves, a summary call on the same history, then two moves from the rewritten prompt."""
    messages, calls = [SYS, TASK], []
    for move in ("right", "down"):
        calls.append(agent.call("default", messages, move))
        messages = messages + [asst(move), user(f"You moved {move}. Your move?")]
    summary = agent.call("default", messages + [SUMMARISE], "I went right then down.")
    calls.append(summary)
    messages = [SYS, user(f"{TASK['content']}\nYour notes: I went right then down."), user("Your move?")]
    for move in ("left", "up"):
        calls.append(agent.call("default", messages, move))
        messages = messages + [asst(move), user(f"You moved {move}. Your move?")]
    return calls


def test_a_compacting_agent_trains_the_summary_and_every_segment_once() -> None:
    tracker, agent = make_tracker()
    calls = compacting_episode(agent)
    assert [c.fork_cause for c in calls] == ["first_call", "", "", "history_rewritten", ""]
    assert [c.timeline_id for c in calls] == [0, 0, 0, 1, 1]
    samples = timelines_to_samples(merge_timelines(tracker.timelines()), episode_id="e", group_id="g", reward=1.0)
    before, after = samples
    # the summary call is trained, in the sample of the turns it summarises
    summary = calls[2]
    start = len(summary.prompt_ids)
    assert before.input_ids == summary.prompt_ids + summary.completion_ids
    assert all(before.loss_mask[start:]) and set(before.token_call_ids[start:]) == {2}
    # the segment after the rewrite starts from the rewritten prompt, token for token
    rewritten = calls[3]
    assert after.input_ids[: len(rewritten.prompt_ids)] == rewritten.prompt_ids
    assert agent.renderer.decode(after.input_ids).startswith(agent.renderer.render(
        [SYS, user(f"{TASK['content']}\nYour notes: I went right then down."), user("Your move?")]))
    # nothing trained twice: the trained tokens are exactly the completions, each once
    trained = sum(sum(s.loss_mask) for s in samples)
    assert trained == sum(len(c.completion_ids) for c in calls)
    assert {c for s in samples for c in s.token_call_ids if c >= 0} == {0, 1, 2, 3, 4}
    # the reward and advantage reach every segment
    assert [s.reward for s in samples] == [1.0, 1.0]
    assign_token_advantages(samples, {"e": 0.5})
    for s in samples:
        assert {a for a, m in zip(s.advantage, s.loss_mask, strict=True) if m} == {0.5}
    # the breaks are named
    assert [s.metadata["break"] for s in samples] == ["", "rewrite"]


def test_breaks_are_named_for_truncation_templates_and_splits() -> None:
    assert set(BREAKS) == set(FORK_CAUSES)  # every fork cause has its name
    tracker, agent = make_tracker()
    agent.call("default", [SYS, TASK], "rig", eos=False)  # cut at max_tokens
    # the agent sends back other text than the cut reply ("rig" -> "right")
    agent.call("default", [SYS, TASK, asst("right"), user("Your move?")], "down")
    samples = timelines_to_samples(tracker.timelines(), episode_id="e", group_id="g", reward=0.0)
    assert [s.metadata["break"] for s in samples] == ["", "truncation"]
    assert break_of("template_not_prefix_preserving") == "template"
    # a sample over the budget is split; the later piece names the split
    long = timelines_to_samples(tracker.timelines()[:1], episode_id="e", group_id="g", reward=0.0)
    cfg = ContextConfig(max_sample_tokens=len(long[0].input_ids) - 2, overflow_policy=OverflowPolicy.split)
    pieces, counts = apply_budget(long, cfg, 4096)
    assert counts["overflow/split_pieces"] >= 1
    assert [p.metadata.get("break", "") for p in pieces][1:] == ["split"] * (len(pieces) - 1)


def test_the_viewer_shows_a_samples_break() -> None:
    record = {"input_ids": [1, 2], "loss_mask": [0, 1], "break": "rewrite"}
    assert page_record(record, "here")["break"] == "rewrite"
    assert page_record({"input_ids": [1], "loss_mask": [0]}, "here")["break"] == ""
