"""`group_rank` judge: the reply's parse, ranking -> scores, the prompt's budget, the retry once,
a failing judge dropping its group (never scoring it 0), the config refusals, and that the
judge's calls to the policy are never recorded or trained."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from ajet.backbones.registry import backbone_problems
from ajet.cli import serve as serve_cmd
from ajet.cli import train as train_cmd
from ajet.config import load_config
from ajet.config.schema import AjetConfig, GroupRankConfig, JudgeConfig, RolloutConfig
from ajet.context.types import LLMCall, Timeline
from ajet.errors import ConfigError
from ajet.judge import JudgeError, build_judge
from ajet.judge.group_rank import (
    GroupRankJudge,
    JudgeCost,
    Trajectory,
    UnreadableScores,
    parse_group_scores,
    rank_scores,
    render_trajectory,
)
from ajet.rl.samples import build_step_batch
from ajet.rollout.episode import OK
from ajet.rollout.manager import RolloutManager
from ajet.rollout.runner import TaskRunner
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask


def scores_json(*scores: float) -> str:
    return json.dumps({"scores": [{"trajectory": i, "reason": "r", "score": s} for i, s in enumerate(scores, 1)]})


class ScriptedClient:
    """`client.chat.completions.create(...)` answering each task (found in the prompt) with its
    next canned reply (a string, an exception to raise, or a number of seconds to hang)."""

    def __init__(self, replies: dict[str, list[Any]]) -> None:
        self.replies = {task: list(texts) for task, texts in replies.items()}
        self.requests: list[dict] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **kwargs: Any) -> Any:
        self.requests.append(kwargs)
        prompt = kwargs["messages"][1]["content"]
        task = next(t for t in self.replies if f"Task:\n{t}\n" in prompt)
        reply = self.replies[task].pop(0)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, float):
            await asyncio.sleep(reply)
        usage = SimpleNamespace(prompt_tokens=100, completion_tokens=10)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=str(reply)))], usage=usage)


# ---------------------------------------------------------------------- the reply
@pytest.mark.parametrize("reply,scores", [
    (scores_json(0.9, 0.2, 0.5), [0.9, 0.2, 0.5]),
    ('Sure.\n```json\n{"scores": [{"trajectory": 3, "score": 0.5}, {"trajectory": 1, "score": 1},'
     ' {"trajectory": 2, "score": "0.25"}]}\n```', [1.0, 0.25, 0.5]),  # any order, fenced, a "0.25"
    ('{"scores": [0.1, 0.2, 0.3]}', [0.1, 0.2, 0.3]),
    ('{"scores": {"1": 0.1, "trajectory 2": 0.2, "#3": 0.3}}', [0.1, 0.2, 0.3]),
    ('{"1": 0, "2": 1, "3": 0.5}', [0.0, 1.0, 0.5]),
    ('{"ranking": [2, 3, 1]}', [0.0, 1.0, 0.5]),
    ("Trajectory 1: 0.4\nTrajectory 2 (score 0.6)\ntrajectory #3: 1", [0.4, 0.6, 1.0]),
])
def test_parse_group_scores(reply: str, scores: list[float]) -> None:
    assert parse_group_scores(reply, 3) == pytest.approx(scores)


@pytest.mark.parametrize("reply,why", [
    (scores_json(0.9, 0.2), r"missing \[3\]"),
    ('{"scores": [{"trajectory": 1, "score": 0.9}, {"trajectory": 1, "score": 0.1}, '
     '{"trajectory": 3, "score": 0.1}]}', r"missing \[2\], unknown or repeated \[1\]"),
    ('{"scores": [0.1, 0.2, 0.3, 0.4]}', "4 scores for 3 trajectories"),
    (scores_json(0.9, 8, 0.5), r"outside \[0, 1\]"),  # a 0-10 scale is not silently clamped
    ('{"scores": [0.1, "high", 0.3]}', "not a number"),
    ('{"scores": [0.1, true, 0.3]}', "not a number"),
    ('{"reason": "all good"}', 'no "scores"'),
    ('{"ranking": [1, 1, 2]}', "is not each of 1..3 once"),
    ("They are all fine, 3 of them.", "no JSON object"),
])
def test_unreadable_replies_say_why(reply: str, why: str) -> None:
    with pytest.raises(UnreadableScores, match=why):
        parse_group_scores(reply, 3)


def test_rank_scores_spread_the_ranking_evenly_from_1_to_0() -> None:
    assert rank_scores([3, 1, 4, 2], 4) == pytest.approx([2 / 3, 0.0, 1.0, 1 / 3])
    assert rank_scores([1], 1) == [1.0]


# ---------------------------------------------------------------------- the prompt
def test_render_keeps_the_budget_the_answer_first_and_marks_cuts() -> None:
    calls = [{"name": "search", "arguments": '{"q": "x"}', "result": "r" * 500} for _ in range(10)]
    trajectory = Trajectory(answer="A" * 100 + "THE END", tool_calls=calls)
    text = render_trajectory(trajectory, 600, include_tool_calls=True)
    body = text.replace("Tool calls:\n", "").replace("Final answer:\n", "")
    assert len(body) <= 600 + 20  # newlines between the lines, about
    assert "THE END" in text and "1. search(" in text
    assert "chars cut]" in text and "more tool calls not shown" in text
    long_answer = render_trajectory(Trajectory("B" * 5000, calls), 600, include_tool_calls=True)
    assert long_answer.count("B") >= 250  # the answer keeps half the budget at least
    hidden = render_trajectory(trajectory, 600, include_tool_calls=False)
    assert "search" not in hidden and hidden.startswith("Final answer:\nAAA")
    assert render_trajectory(Trajectory("", []), 600, True) == "Tool calls:\n(none)\nFinal answer:\n(no final answer)"


def test_trajectory_from_recorded_calls() -> None:
    first = LLMCall("default", [1], [2], [0.0], "tool_calls", 0, messages=[{"role": "user", "content": "q"}],
                    response_message={"content": "", "tool_calls": [
                        {"id": "c1", "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}]})
    second = LLMCall("default", [1], [2], [0.0], "stop", 0,
                     messages=[{"role": "tool", "tool_call_id": "c1", "content": "4"}],
                     response_message={"content": "It is 4."})
    trajectory = Trajectory.from_calls([first, second], "")
    assert trajectory.answer == "It is 4."  # no final_answer: the last reply
    assert trajectory.tool_calls == [{"name": "calc", "arguments": '{"e": "2+2"}', "result": "4"}]
    assert Trajectory.from_calls([first, second], "4").answer == "4"


def test_prompt_shows_every_trajectory_the_rubric_and_the_reference() -> None:
    judge = GroupRankJudge(GroupRankConfig(rubric="Shorter is better."), client=object())
    task = WorkflowTask(task_id="t", main_query="2+2?", metadata={"answer": "4"})
    system, user = judge.messages(task, [Trajectory("4"), Trajectory("5", [{"name": "calc", "arguments": "{}",
                                                                             "result": "5"}])])
    assert "Shorter is better." in system["content"] and "2 trajectories" in system["content"]
    assert "Reference answer:\n4" in user["content"]
    assert "<trajectory 1>\nTool calls:\n(none)\nFinal answer:\n4\n</trajectory 1>" in user["content"]
    assert "1. calc({}) -> 5" in user["content"]


# ---------------------------------------------------------------------- retry once
TASK = WorkflowTask(task_id="t", main_query="2+2?")


def test_an_unreadable_reply_is_asked_for_once_more() -> None:
    client = ScriptedClient({"2+2?": ["I like both.", scores_json(1.0, 0.0)]})
    judge, cost = GroupRankJudge(GroupRankConfig(), client=client), JudgeCost()
    assert asyncio.run(judge.ascore_group(TASK, [Trajectory("4"), Trajectory("5")], cost)) == [1.0, 0.0]
    assert (cost.calls, cost.retries, cost.prompt_tokens, cost.completion_tokens) == (2, 1, 200, 20)
    retry = client.requests[1]["messages"]
    assert retry[2] == {"role": "assistant", "content": "I like both."}
    assert "could not be read: no JSON object" in retry[3]["content"]


def test_a_second_unreadable_reply_gives_up() -> None:
    client = ScriptedClient({"2+2?": ["I like both.", scores_json(1.0), scores_json(1.0, 0.0)]})
    judge, cost = GroupRankJudge(GroupRankConfig(), client=client), JudgeCost()
    with pytest.raises(UnreadableScores, match=r"missing \[2\].*twice"):
        asyncio.run(judge.ascore_group(TASK, [Trajectory("4"), Trajectory("5")], cost))
    assert cost.calls == 2 and cost.retries == 1  # not a third time


# ---------------------------------------------------------------------- in the rollout
class Recorded:
    """A tracker holding one recorded call (a tool call, then the answer) and its timeline."""

    def __init__(self, k: int) -> None:
        self.calls = [LLMCall("default", [1, 2, 3], [10 + k, 20 + k], [-0.5, -0.7], "stop", 0,
                              response_message={"content": f"answer {k}"})]

    def timelines(self) -> list[Timeline]:
        (call,) = self.calls
        tokens = [*call.prompt_ids, *call.completion_ids]
        return [Timeline(0, "default", tokens, [False] * 3 + [True] * 2, [0.0] * 3 + [-0.5, -0.7], [0], [(3, 5)])]

    def stats(self) -> dict[str, float]:
        return {}


class Handle:
    def __init__(self, k: int) -> None:
        self.tracker = Recorded(k)
        self.tuner = k

    def close(self) -> None:
        pass


class Factory:
    def __init__(self) -> None:
        self.opened = 0

    def open_episode(self, episode_id: str, task: WorkflowTask) -> Handle:
        self.opened += 1
        return Handle(int(episode_id.rsplit("e", 1)[1]))


class NoReward(Workflow):
    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        return WorkflowOutput(reward=None)  # the judge scores it (answer: the recorded reply)


def group_rollout(replies: dict[str, list[Any]], *, n: int = 2, timeout_s: float = 5.0) -> Any:
    cfg = RolloutConfig(n=n, episode_timeout_s=timeout_s, max_retries=0, blocked_loop_warn_s=0)
    judge = GroupRankJudge(GroupRankConfig(), client=ScriptedClient(replies))
    tasks = [WorkflowTask(task_id=query, main_query=query) for query in replies]
    return asyncio.run(RolloutManager(TaskRunner(NoReward(), judge, Factory(), cfg), cfg).rollout(tasks)), judge


def test_groups_are_scored_together_and_a_failed_judge_drops_its_group() -> None:
    result, judge = group_rollout({"good": [scores_json(0.25, 1.0)], "bad": ["no idea", "still no idea"],
                                   "fixed": ["?", '{"ranking": [2, 1]}']})
    by_id = {e.episode_id: e for e in result.episodes}
    assert [(by_id[f"good-e{k}"].status, by_id[f"good-e{k}"].reward) for k in (0, 1)] == [(OK, 0.25), (OK, 1.0)]
    assert by_id["good-e1"].is_success and not by_id["good-e0"].is_success  # success_threshold 0.7
    assert by_id["good-e0"].output.reward == 0.25
    assert [by_id[f"fixed-e{k}"].reward for k in (0, 1)] == [0.0, 1.0]  # ranked after one retry
    prompts = [r["messages"][1]["content"] for r in judge._client.requests]
    assert all("answer 0" in p and "answer 1" in p for p in prompts)  # one call sees the whole group

    # The bad group: failed (not scored 0), counted, and kept out of the training batch.
    bad = [by_id["bad-e0"], by_id["bad-e1"]]
    assert all(e.status == "failed" and e.reason == "group_judge:unreadable" for e in bad)
    assert "twice" in bad[0].error_message and bad[0].timelines == []
    assert result.dropped_groups == ["bad"]
    assert {e.group_id for e in result.ok_episodes} == {"good", "fixed"}
    batch = build_step_batch(result.ok_episodes, AjetConfig().context, AjetConfig().algorithm, model_max_len=64)
    assert {s.group_id for s in batch.samples} == {"good", "fixed"}

    m = result.metrics()
    assert m["judge/group_judged"] == 2 and m["judge/group_failures"] == 1
    assert m["judge/group_calls"] == 5 and m["judge/group_retries"] == 2
    assert m["judge/group_prompt_tokens"] == 500 and m["judge/group_completion_tokens"] == 50
    assert m["judge/group_seconds"] >= 0 and m["rollout/failed/group_judge:unreadable"] == 2
    assert m["rollout/dropped_groups"] == 1 and m["reward/mean"] == pytest.approx((0.25 + 1 + 0 + 1) / 4)


@pytest.mark.parametrize("reply,reason", [
    (ConnectionError("refused"), "group_judge:call_error"),
    (2.0, "group_judge:timeout"),  # hangs past the limit
])
def test_an_endpoint_error_or_a_hang_drops_the_group(reply: Any, reason: str) -> None:
    result, _ = group_rollout({"q": [reply]}, timeout_s=0.5)
    assert [e.reason for e in result.episodes] == [reason, reason]
    assert result.ok_episodes == [] and result.dropped_groups == ["q"]
    assert result.metrics()["judge/group_failures"] == 1


def test_a_workflow_reward_is_kept_and_not_judged() -> None:
    class Rewarded(Workflow):
        async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
            return WorkflowOutput(reward=0.5)

    cfg = RolloutConfig(n=2, episode_timeout_s=5, blocked_loop_warn_s=0)
    client = ScriptedClient({"q": []})
    runner = TaskRunner(Rewarded(), GroupRankJudge(GroupRankConfig(), client=client), Factory(), cfg)
    result = asyncio.run(RolloutManager(runner, cfg).rollout([WorkflowTask(task_id="q", main_query="q")]))
    assert [e.reward for e in result.ok_episodes] == [0.5, 0.5] and client.requests == []


# ---------------------------------------------------------------------- config
def test_config_refuses_n_1_and_params(stub_run_conf: Callable[..., Path]) -> None:
    conf = stub_run_conf("judge: {type: group_rank}\nalgorithm: {name: reinforce_pp}\n")
    assert load_config(conf).judge.group_rank.max_chars_per_trajectory == 2000
    with pytest.raises(ConfigError, match=r"rollout.n: is 1, but judge.type=group_rank scores the rollout.n episodes"):
        load_config(conf, ["rollout.n=1"])
    with pytest.raises(ConfigError, match=r"judge.params: \['rubric'\] is not read by judge.type=group_rank"):
        load_config(stub_run_conf("judge: {type: group_rank, params: {rubric: x}}\n"))
    with pytest.raises(ConfigError, match="judge.group_rank.model: required with judge.group_rank.base_url"):
        load_config(conf, ["judge.group_rank.base_url=http://judge:8000/v1"])
    with pytest.raises(ConfigError, match="judge.group_rank.max_tokens: 2048 exceeds context.max_call_tokens"):
        load_config(conf, ["judge.group_rank.max_tokens=2048"])


def test_build_judge_reads_judge_group_rank() -> None:
    cfg = JudgeConfig(type="group_rank", group_rank=GroupRankConfig(rubric="R", base_url="http://x/v1", model="m"))
    judge = build_judge(cfg)
    assert isinstance(judge, GroupRankJudge) and judge.cfg.rubric == "R" and judge.model == "m"
    with pytest.raises(JudgeError, match="is not read by judge.type=group_rank"):
        build_judge(JudgeConfig(type="group_rank", params={"rubric": "R"}))
    with pytest.raises(JudgeError, match="needs judge.group_rank.base_url"):
        build_judge(JudgeConfig(type="group_rank"))  # no endpoint and no local model
    with pytest.raises(JudgeError, match="cannot be a component"):
        build_judge(JudgeConfig(type="composite", params={"components": {"g": {"type": "group_rank"}}}),
                    llm_client_factory=object)


def test_gpu_backbones_and_serve_refuse_it(tmp_path: Path, stub_run_conf: Callable[..., Path]) -> None:
    cfg = AjetConfig()
    cfg.judge.type = "group_rank"
    for backbone in ("trinity", "verl"):
        problems = dict(backbone_problems(backbone, cfg))
        assert "=group_rank (a judge that scores a group's episodes together) runs on --backbone=debug" in problems["judge.type"]
    conf = stub_run_conf("judge: {type: group_rank}\n")
    dry = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--backbone=verl", "--dry-run"])
    assert dry.exit_code == 2 and "judge.type" in dry.output and "Traceback" not in dry.output
    served = CliRunner().invoke(serve_cmd.app, ["--conf", str(conf)])
    assert served.exit_code == 2 and "judge.type=group_rank" in served.output


# ---------------------------------------------------------------------- on the policy
class OneCall(Workflow):
    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        reply = await tuner([{"role": "user", "content": task.main_query}])
        text = "".join(b.get("text", "") for b in reply.content if b.get("type") == "text")
        return WorkflowOutput(reward=None, metadata={"final_answer": text})


class CannedReply:
    """The policy's own client, its reply's text replaced by a readable verdict (the tiny random
    model writes none): the call still runs on the engine through the gateway's service key."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.usage = inner, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **kwargs: Any) -> Any:
        response = await self.inner.chat.completions.create(**kwargs)
        self.usage.append(response.usage.completion_tokens)
        response.choices[0].message.content = scores_json(0.0, 1.0)
        return response


def test_the_judges_calls_on_the_policy_are_never_recorded(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ajet.rollout.engine_rollout import EngineRollout

    cfg = AjetConfig()
    cfg.rollout.n, cfg.rollout.max_tokens, cfg.rollout.max_concurrency = 2, 4, 2
    cfg.judge.type = "group_rank"
    cfg.judge.group_rank.max_tokens = 16
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    clients: list[CannedReply] = []
    rollouts: list[EngineRollout] = []

    def factory() -> CannedReply:
        clients.append(CannedReply(rollouts[0].llm_client()))
        return clients[-1]

    judge = build_judge(cfg.judge, llm_client_factory=factory)
    rollouts.append(EngineRollout.local(cfg, model, tokenizer, OneCall(), model_max_len=2048, judge=judge))
    try:
        result = rollouts[0].rollout([WorkflowTask(task_id="t", main_query="Say hi.")], 2, episode_prefix="")
    finally:
        rollouts[0].close()
    assert [e.reward for e in result.ok_episodes] == [0.0, 1.0]
    assert clients[0].usage and clients[0].usage[0] > 0  # the judge's call ran on the engine
    for episode in result.ok_episodes:  # only the workflow's own call is recorded and trained
        assert episode.num_calls == 1 and len(episode.timelines) == 1
        assert sum(episode.timelines[0].trainable) <= cfg.rollout.max_tokens
