"""Bad inputs from a new user (issue 16): each fails loudly, in one place, and takes nothing down.

One test (or a parametrised group) per case: a NaN reward, a bad data line, a huge prompt, a
duplicate YAML key, a non-finite setting, a coerced reward, a repaired tool call.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from ajet.config.schema import RolloutConfig
from ajet.rollout.manager import RolloutManager
from ajet.rollout.runner import TaskRunner
from ajet.rollout.workflow_loader import FunctionWorkflow
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

NAN, INF = float("nan"), float("inf")

# ------------------------------------------------------------------ rollout fakes


@dataclass
class Tracker:
    calls: list[int] = field(default_factory=list)

    def timelines(self) -> list[int]:
        return list(self.calls)

    def stats(self) -> dict[str, int]:
        return {"calls": len(self.calls)}


@dataclass
class Handle:
    tuner: Any
    tracker: Tracker

    def close(self) -> None:
        pass


class Factory:
    def open_episode(self, episode_id: str, task: WorkflowTask) -> Handle:
        tracker = Tracker([1])
        return Handle(tuner=episode_id, tracker=tracker)


class RewardFromTask(Workflow):
    """Returns `task.metadata["reward"]` as is (NaN, inf, "0.7"...) in a WorkflowOutput."""

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        return WorkflowOutput(reward=task.metadata["reward"], log_metrics=task.metadata.get("log", {}))


async def reward_fn(task: dict, model) -> float:  # noqa: ANN001 - the function form
    return task["reward"]


class ConstJudge:
    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> Any:
        return self.verdict


def tasks_with(rewards: list[Any], log: dict[str, Any] | None = None) -> list[WorkflowTask]:
    log = log or {}
    return [
        WorkflowTask(task_id=f"t{i}", metadata={"reward": r, "log": log.get(f"t{i}", {})})
        for i, r in enumerate(rewards)
    ]


def manager(workflow: Workflow, judge: Any = None) -> RolloutManager:
    cfg = RolloutConfig(n=1, episode_timeout_s=5, max_retries=0)
    return RolloutManager(TaskRunner(workflow, judge, Factory(), cfg), cfg)


def rollout(workflow: Workflow, rewards: list[Any], judge: Any = None):
    mgr = manager(workflow, judge)
    try:
        return asyncio.run(mgr.rollout(tasks_with(rewards)))
    finally:
        mgr.runner.close()


# ------------------------------------------------------------------ 1. NaN / inf rewards


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("form", ["class", "function"])
def test_non_finite_reward_fails_the_episode_as_bad_output(form: str, bad: float) -> None:
    workflow = RewardFromTask() if form == "class" else FunctionWorkflow(reward_fn)
    result = rollout(workflow, [1.0, bad, 0.0])
    by_task = {e.task.task_id: e for e in result.episodes}
    failed = by_task["t1"]
    assert (failed.status, failed.reason) == ("failed", "bad_output")
    assert repr(bad) in failed.error_message and "'t1'" in failed.error_message
    assert [e.task.task_id for e in result.ok_episodes] == ["t0", "t2"]
    m = result.metrics()  # crashed in statistics.pstdev before
    assert m["rollout/failed/bad_output"] == 1 and m["reward/mean"] == 0.5
    assert all(math.isfinite(v) for v in m.values())


@pytest.mark.parametrize("verdict", [(NAN, False), (INF, True), -INF])
def test_non_finite_reward_from_a_judge_fails_the_episode(verdict: Any) -> None:
    result = rollout(RewardFromTask(), [None], judge=ConstJudge(verdict))
    (ep,) = result.episodes
    assert (ep.status, ep.reason) == ("failed", "judge_error:non_finite_reward")
    assert "ConstJudge" in ep.error_message and "'t0'" in ep.error_message
    assert "reward/mean" not in result.metrics()


def test_non_finite_log_metrics_are_dropped_counted_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = {"t0": {"turns": 2.0}, "t1": {"turns": NAN}, "t2": {"turns": 4.0, "judge/x": INF}}
    mgr = manager(RewardFromTask())
    with caplog.at_level(logging.WARNING, logger="ajet.rollout"):
        m = asyncio.run(mgr.rollout(tasks_with([1.0, 1.0, 1.0], log))).metrics()
        asyncio.run(mgr.rollout(tasks_with([1.0, 1.0, 1.0], log))).metrics()  # a second step
    assert m["workflow/turns"] == 3.0 and "judge/x" not in m
    assert m["rollout/dropped_log_metrics"] == 2
    warned = [r.getMessage() for r in caplog.records if "log_metrics" in r.getMessage()]
    assert len(warned) == 2  # one per key, not one per episode or step
    assert any("'turns'" in w for w in warned) and any("'judge/x'" in w for w in warned)


def test_advantages_refuse_non_finite_rewards() -> None:
    from ajet.algorithms import (
        compute_advantages,
        grpo_advantages,
        reinforce_pp_advantages,
        rloo_advantages,
    )
    from ajet.config.schema import AlgorithmConfig

    with pytest.raises(ValueError, match="'e1'.*nan"):
        compute_advantages(AlgorithmConfig(), ["e0", "e1"], [1.0, NAN], ["g", "g"])
    with pytest.raises(ValueError, match="'e0'.*inf"):
        compute_advantages(
            AlgorithmConfig(name="reinforce_pp"), ["e0"], [1.0], ["g"], step_rewards=[[INF]]
        )
    for fn in (grpo_advantages, rloo_advantages):
        with pytest.raises(ValueError, match=r"rewards\[1\] is inf"):
            fn([0.0, INF], ["g", "g"])
    with pytest.raises(ValueError, match="finite"):
        reinforce_pp_advantages([0.0, 1.0], step_rewards=[[NAN], None])


# ------------------------------------------------------------------ 9. coerced rewards


@pytest.mark.parametrize(
    ("reward", "shown"), [("0.7", "reward='0.7' (str)"), ("high", "reward='high' (str)"),
                          (True, "reward=True (bool)")],
)
def test_reward_of_the_wrong_type_is_bad_output_naming_field_value_and_workflow(
    reward: Any, shown: str
) -> None:
    (ep,) = rollout(RewardFromTask(name="my_agent"), [reward]).episodes
    assert (ep.status, ep.reason) == ("failed", "bad_output")
    assert shown in ep.error_message and "valid number" in ep.error_message
    assert "'my_agent'" in ep.error_message and "'t0'" in ep.error_message


def test_workflow_output_types_are_strict_but_take_numpy_scalars() -> None:
    import numpy as np
    from pydantic import ValidationError

    out = WorkflowOutput(reward=np.float32(0.5), is_success=np.bool_(True), log_metrics={"n": 3})
    assert (out.reward, out.is_success, out.log_metrics) == (0.5, True, {"n": 3.0})
    for bad in ({"reward": "0.7"}, {"is_success": 1}, {"is_success": "yes"},
                {"step_rewards": [1.0, NAN]}, {"log_metrics": {"n": "3"}}):
        with pytest.raises(ValidationError):
            WorkflowOutput(**bad)
    with pytest.raises(ValidationError, match="reward"):
        out.reward = "0.9"  # assignment is checked too


def test_judge_returning_a_string_is_not_coerced() -> None:
    (ep,) = rollout(RewardFromTask(), [None], judge=ConstJudge(("0.7", True))).episodes
    assert (ep.status, ep.reason) == ("failed", "judge_error:bad_return")


# ------------------------------------------------------------------ 2. non-UTF-8 data line


def test_non_utf8_jsonl_line_is_a_malformed_line_fail_or_skip(tmp_path, caplog) -> None:
    from ajet.config.schema import OnError
    from ajet.task_reader.base import TaskReaderError
    from ajet.task_reader.jsonl import read_jsonl_tasks

    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"question": "q1"}\n\xff\xfe\x00garbage\x80\n{"question": "caf\xc3\xa9"}\n')
    with pytest.raises(TaskReaderError, match=rf"{path}:2: malformed task: not valid UTF-8"):
        read_jsonl_tasks(path)  # a UnicodeDecodeError traceback before
    with caplog.at_level(logging.WARNING, logger="ajet.task_reader"):
        tasks, skipped = read_jsonl_tasks(path, on_error=OnError.skip)
    assert [t.main_query for t in tasks] == ["q1", "café"] and skipped == 1
    assert any(f"{path}:2" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ 3. a sync execute that never returns

HANGING_RUN = '''
import asyncio, logging, sys, threading
from ajet.config.schema import RolloutConfig
from ajet.rollout.manager import RolloutManager
from ajet.rollout.runner import TaskRunner
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask
sys.path.insert(0, sys.argv[1])
from test_bad_inputs import Factory

class Hangs(Workflow):
    def execute(self, task, tuner):  # sync: runs in a thread that cannot be stopped
        if task.task_id == "busy":
            while True:
                pass
        if task.task_id == "blocked":
            threading.Event().wait()
        return WorkflowOutput(reward=1.0)

class AsyncHangs(Workflow):
    async def execute(self, task, tuner):  # a blocking call handed to asyncio.to_thread
        await asyncio.to_thread(threading.Event().wait)

logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
cfg = RolloutConfig(n=1, episode_timeout_s=0.5, max_retries=0, max_concurrency=2)
runner = TaskRunner(Hangs(), None, Factory(), cfg)
mgr = RolloutManager(runner, cfg)
for step in range(3):  # hung threads must not starve later steps either
    tasks = [WorkflowTask(task_id=t) for t in ("busy", "blocked", "fine")]
    result = asyncio.run(mgr.rollout(tasks))
    print("STEP", step, sorted((e.task.task_id, e.status) for e in result.episodes), flush=True)
runner.close()
cfg = RolloutConfig(n=2, episode_timeout_s=0.5, max_retries=0)
runner = TaskRunner(AsyncHangs(), None, Factory(), cfg)
result = asyncio.run(RolloutManager(runner, cfg).rollout([WorkflowTask(task_id="to_thread")]))
print("ASYNC", sorted(e.status for e in result.episodes), flush=True)
runner.close()
print("DONE", flush=True)
'''


def test_a_sync_execute_that_never_returns_does_not_hold_the_process(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "hangs.py"
    script.write_text(HANGING_RUN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Before: the ThreadPoolExecutor's workers were joined at exit, so this never ended, and
    # with max_concurrency=2 the two hung workers made "fine" time out from step 1 on.
    proc = subprocess.run([sys.executable, str(script), str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for step in range(3):
        assert (f"STEP {step} [('blocked', 'timeout'), ('busy', 'timeout'), ('fine', 'ok')]"
                in out), out
    assert "ASYNC ['timeout', 'timeout']" in out and "DONE" in out
    first, second = [line for line in out.splitlines() if "never returned" in line]
    assert "6 call(s) made by episodes" in first and "(task busy, sync execute" in first
    assert "(task blocked, sync execute" in first and "task fine" not in first
    assert "8 call(s)" in second and "to_thread-e1 (task to_thread, asyncio.to_thread" in second


# ------------------------------------------------------------------ 4. an over-long prompt


class CountingChat:
    """Wraps the fake chat format; counts render/encode calls and the threads they ran on."""

    def __init__(self) -> None:
        from test_tuner_fakes import FakeChat

        self.inner = FakeChat()
        self.eos_token_ids = self.inner.eos_token_ids
        self.max_token_chars = self.inner.max_token_chars
        self.threads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def render(self, *args: Any, **kwargs: Any) -> str:
        import threading

        self.threads.append(threading.current_thread().name)
        return self.inner.render(*args, **kwargs)


def budget_session(chat: CountingChat, window: int):
    from test_tuner_fakes import FakeEngine

    from ajet.config.schema import ContextConfig
    from ajet.context.tracker import ContextTracker
    from ajet.tuner.session import EpisodeSession

    tracker = ContextTracker(chat, None, ContextConfig())
    return EpisodeSession("e0", FakeEngine(chat.inner, ["ok"]), chat, tracker,
                          RolloutConfig(max_tokens=8), ContextConfig(), None, window)


def test_an_over_long_prompt_fails_fast_before_tokenising() -> None:
    from ajet.tuner.session import ContextBudgetError

    chat = CountingChat()
    session = budget_session(chat, window=1000)
    huge = "x" * (1000 * chat.max_token_chars)  # cannot fit whatever the tokenizer does
    with pytest.raises(ContextBudgetError, match="refused before tokenising"):
        asyncio.run(session.chat("main", [{"role": "user", "content": huge}]))
    assert chat.threads == [] and session.stats()["tuner/failed_calls"] == 1
    # Under the bound: rendered and tokenised, off the loop's thread.
    result = asyncio.run(session.chat("main", [{"role": "user", "content": "x" * 100}]))
    assert result.message["content"] == "ok"
    assert chat.threads and "MainThread" not in chat.threads


def test_chat_format_max_token_chars_bounds_every_token(bundled_model_dir) -> None:
    from transformers import AutoTokenizer

    from ajet.engine.chat import ChatFormat

    tok = AutoTokenizer.from_pretrained(bundled_model_dir)
    chat = ChatFormat(tok)
    longest = max(len(chat.decode([i])) for i in range(len(tok)))
    assert 1 < longest <= chat.max_token_chars


def test_the_watchdog_names_ajet_when_the_block_is_ajets(caplog, tmp_path) -> None:
    import time
    from pathlib import Path

    import ajet
    from ajet.rollout.watchdog import LoopWatchdog

    # A function whose code lives in ajet's package (as the tokenizer call in tracker.py did)
    # blocks the loop by calling into a library (time.sleep, as tokenizers' Rust code would).
    namespace: dict[str, Any] = {"time": time}
    fake = str(Path(ajet.__file__).parent / "context" / "slow_tokenize.py")
    exec(compile("def encode():\n    time.sleep(1.2)\n", fake, "exec"), namespace)  # noqa: S102

    async def main() -> None:
        watchdog = LoopWatchdog(asyncio.get_running_loop(), threshold_s=0.4, interval_s=0.1).start()
        try:
            namespace["encode"]()
        finally:
            watchdog.stop()

    with caplog.at_level(logging.WARNING, logger="ajet.rollout.watchdog"):
        asyncio.run(main())
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "ajet's own code (encode in slow_tokenize.py)" in warning and "bug in ajet" in warning
    assert "Blocking code in an async workflow" not in warning


# ------------------------------------------------------------------ 5. every episode failed


class FailsOn(Workflow):
    """Raises for the tasks listed in `task.metadata["fail"]` (truthy)."""

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        if task.metadata.get("fail"):
            raise RuntimeError(f"client gave up after 120 s on {task.task_id}")
        return WorkflowOutput(reward=1.0)


def step_episodes(fail: list[bool]):
    tasks = [WorkflowTask(task_id=f"t{i}", metadata={"fail": f}) for i, f in enumerate(fail)]
    mgr = manager(FailsOn())
    return asyncio.run(mgr.rollout(tasks)).episodes


def test_consecutive_all_failed_steps_stop_the_run_with_reason_and_traceback() -> None:
    from ajet.rollout.failed_steps import AllEpisodesFailedError, FailedSteps

    guard = FailedSteps(max_failed_steps=3)
    all_failed, one_ok = step_episodes([True, True]), step_episodes([True, False])
    guard.observe(1, all_failed)
    guard.observe(2, all_failed)
    guard.observe(3, one_ok)  # one ok episode resets the streak
    guard.observe(4, all_failed)
    guard.observe(5, all_failed)
    with pytest.raises(AllEpisodesFailedError) as info:
        guard.observe(6, all_failed)
    text = str(info.value)
    assert "every episode failed in 3 consecutive steps (steps 4-6, 6 episodes)" in text
    assert "Main reason: workflow_error:RuntimeError (6 of 6)" in text
    assert "task 't0'" in text and "Traceback (most recent call last)" in text
    assert "RuntimeError: client gave up after 120 s on t0" in text
    never = FailedSteps(max_failed_steps=0)
    for step in range(10):
        never.observe(step, all_failed)  # 0 = never stop


def test_progress_line_shows_failures_by_reason() -> None:
    from ajet.outputs.progress import failed_counts

    m = {"rollout/episodes": 16.0, "rollout/failed": 16.0, "rollout/failed/timeout": 4.0,
         "rollout/failed/workflow_error:RuntimeError": 12.0}
    assert failed_counts(m) == "16/16 (workflow_error:RuntimeError 12, timeout 4)"
    assert failed_counts({"rollout/failed": 0.0}) == "0"


# ------------------------------------------------------------------ 6. duplicate YAML keys


@pytest.mark.parametrize(("yaml_text", "key", "lines"), [
    ("trainer:\n  total_steps: 1\nmodel: {path: m}\ntrainer:\n  lr: 0.001\n", "trainer", (4, 1)),
    ("trainer:\n  total_steps: 1\n  lr: 0.1\n  total_steps: 2\n", "total_steps", (4, 2)),
])
def test_duplicate_yaml_keys_exit_2_naming_both_lines(tmp_path, yaml_text, key, lines) -> None:
    from typer.testing import CliRunner

    from ajet.cli import train as train_cmd
    from ajet.config.loader import ConfigError, load_config

    conf = tmp_path / "run.yaml"
    conf.write_text(yaml_text)
    second, first = lines
    with pytest.raises(ConfigError, match=rf"{conf}:{second}: duplicate key '{key}' "
                                          rf"\(first at {conf}:{first}\)"):
        load_config(conf, require_workflow=False)
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--dry-run"])
    assert result.exit_code == 2 and "duplicate key" in result.output


def test_yaml_merge_keys_and_equal_keys_in_different_sections_are_fine(tmp_path) -> None:
    from ajet.config.loader import load_config

    conf = tmp_path / "run.yaml"
    conf.write_text("trainer:\n  <<: {total_steps: 2, batch_size: 3}\n"
                    "  total_steps: 4\nrollout: {n: 2, max_tokens: 8}\n")
    cfg = load_config(conf, require_workflow=False)
    assert (cfg.trainer.total_steps, cfg.trainer.batch_size, cfg.rollout.n) == (4, 3, 2)


# ------------------------------------------------------------------ 7. --dry-run checks what the run loads


@pytest.mark.parametrize(("body", "target", "expect"), [
    ("", "missing_agent.py:W", "file not found"),
    ("", "agent.py:Missing", "Missing"),
    ("", "no_such_pkg_xyz.agent:W", "no_such_pkg_xyz"),
    ("judge: {type: 'no_such_judge_pkg.judges:J'}\n", "agent.py:W", "no_such_judge_pkg"),
    ("judge: {type: 'agent.py:NoJudge'}\n", "agent.py:W", "NoJudge"),
    ("", "agent.py:W", "/no/such/model_dir"),  # with the override model.path=...
])
def test_dry_run_fails_where_the_run_would(tmp_path, stub_run_conf, body, target, expect) -> None:
    from typer.testing import CliRunner

    from ajet.cli import train as train_cmd

    conf = stub_run_conf(body)
    conf.write_text(conf.read_text().replace("agent.py:W", target))
    extra = ["model.path=/no/such/model_dir"] if "model" in expect else []
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--dry-run", *extra])
    assert result.exit_code == 2, result.output
    assert expect in result.output and "Traceback" not in result.output
    assert "# resolved ajet config" not in result.output


def test_dry_run_names_a_missing_initial_path(stub_run_conf) -> None:
    """model.initial_path (what default_model="initial" serves) is checked like model.path,
    and the error names its own key."""
    from typer.testing import CliRunner

    from ajet.cli import train as train_cmd

    result = CliRunner().invoke(train_cmd.app, ["--conf", str(stub_run_conf()), "--dry-run",
                                                "model.initial_path=/no/such/opponent_dir"])
    assert result.exit_code == 2, result.output
    assert "model.initial_path=/no/such/opponent_dir" in result.output and "Traceback" not in result.output


def test_dry_run_passes_and_says_what_it_checked(stub_run_conf) -> None:
    from typer.testing import CliRunner

    from ajet.cli import train as train_cmd

    result = CliRunner().invoke(train_cmd.app, ["--conf", str(stub_run_conf()), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "# checked: workflow" in result.output and "(W)" in result.output
    assert "# checked: model.path" in result.output


# ------------------------------------------------------------------ 8. non-finite and out-of-range settings


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.temperature=inf", "rollout.temperature: must be a finite number, got inf"),
    ("rollout.temperature=nan", "rollout.temperature: must be a finite number, got nan"),
    ("trainer.lr=-inf", "trainer.lr: must be a finite number, got -inf"),
    ("algorithm.entropy_coef=inf", "algorithm.entropy_coef: must be a finite number"),  # no range
    ("eval.temperature=inf", "eval.temperature: must be a finite number"),  # float | None
    ("sft.task_weights.math=nan", "sft.task_weights.math: must be a finite number"),
    ("vllm_servers.judge.gpu_memory_utilization=inf",
     "vllm_servers.judge.gpu_memory_utilization: must be a finite number"),
    ("rollout.top_p=0", "rollout.top_p: must be in (0, 1], got 0.0"),
    ("rollout.temperature=-0.5", "rollout.temperature: must be >= 0, got -0.5"),
    ("trainer.grad_clip=0", "trainer.grad_clip: must be > 0, got 0.0"),
    ("rollout.max_failed_steps=-1", "rollout.max_failed_steps: must be >= 0, got -1"),
    ("vllm_servers.judge.port=70000", "vllm_servers.judge.port: must be in [0, 65535], got 70000"),
])
def test_every_float_setting_is_finite_and_in_its_declared_range(override, message) -> None:
    from ajet.config.loader import ConfigError, load_config

    extra = ["vllm_servers.judge.model=/m"] if override.startswith("vllm") else []
    with pytest.raises(ConfigError) as err:
        load_config(None, [override, *extra], require_workflow=False)
    assert message in str(err.value)


def test_every_float_field_of_the_schema_is_checked() -> None:
    """A new float setting is checked too: the walk covers the whole schema, not a list."""
    import dataclasses

    from ajet.config.schema import AjetConfig
    from ajet.config.validate import range_problems

    cfg = AjetConfig()
    floats: list[str] = []

    def poison(node: Any, prefix: str) -> None:
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                poison(value, f"{prefix}{f.name}.")
            elif isinstance(value, float) or "float" in str(f.type) and value is None:
                setattr(node, f.name, INF)
                floats.append(f"{prefix}{f.name}")

    poison(cfg, "")
    assert len(floats) > 20 and "rollout.temperature" in floats
    assert sorted(k for k, _ in range_problems(cfg)) == sorted(floats)
    assert range_problems(AjetConfig()) == []  # every default is in range


# ------------------------------------------------------------------ 14. repaired tool calls


@pytest.mark.parametrize(("body", "repair", "arguments"), [
    ('{"name": "add", "description": "adds"}', "no 'arguments', given {}; dropped key(s) "
     "['description']", {}),
    ('{"name": "add", "parameters": {"a": 1}}', "'parameters' read as 'arguments'", {"a": 1}),
    ('{"name": "add", "arguments": "{\\"a\\": 1}"}', "arguments decoded from a JSON string",
     {"a": 1}),
    ('{"name": "add", "arguments": {"a": 1}}', None, {"a": 1}),  # nothing to repair
])
def test_repaired_tool_calls_are_counted_apart_from_malformed_and_logged_raw(
    caplog, body, repair, arguments
) -> None:
    import json

    from ajet.engine.chat import parse_completion

    raw = f"<tool_call>\n{body}\n</tool_call>"
    with caplog.at_level(logging.DEBUG, logger="ajet.engine.chat"):
        parsed = parse_completion(raw + "<tool_call>\nnot json\n</tool_call>")
    (call,) = parsed.tool_calls
    assert json.loads(call["function"]["arguments"]) == arguments
    assert parsed.malformed_tool_call  # the second block
    assert parsed.repaired == ([repair] if repair else [])
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "repaired" in r.getMessage()]
    assert (any(repair in m and repr(raw) in m for m in debug) if repair else debug == [])


def test_repaired_and_malformed_tool_calls_reach_the_episode_metrics() -> None:
    from test_tuner_fakes import FakeChat, FakeEngine

    from ajet.config.schema import ContextConfig
    from ajet.context.tracker import ContextTracker
    from ajet.engine.chat import parse_completion, to_openai_message
    from ajet.tuner.session import EpisodeSession

    class RealParser(FakeChat):  # the fake's tokens, the real reply parser
        def parse_completion(self, text: str) -> Any:
            return parse_completion(text)

        def to_openai_message(self, parsed: Any) -> dict:
            return to_openai_message(parsed)

    chat = RealParser()
    script = ['<tool_call>\n{"name": "add", "description": "x"}\n</tool_call>',
              "<tool_call>\nbroken\n</tool_call>", "plain"]
    tracker = ContextTracker(chat, None, ContextConfig())
    session = EpisodeSession("e0", FakeEngine(chat, script), chat, tracker,
                             RolloutConfig(max_tokens=200), ContextConfig(), None, 4096)
    for _ in script:
        asyncio.run(session.chat("main", [{"role": "user", "content": "hi"}]))
    stats = tracker.stats()  # what the runner puts in the episode (context/... metrics)
    assert (stats["tool_calls/repaired"], stats["tool_calls/malformed"]) == (1.0, 1.0)
    assert session.stats()["tuner/repaired_tool_calls"] == 1


def test_a_forced_call_closed_for_the_model_counts_as_repaired(caplog) -> None:
    from pydantic import BaseModel
    from test_tuner_fakes import make_session
    from test_tuner_model import AS_MESSAGES

    from ajet.tuner import ModelTuner

    class Answer(BaseModel):
        value: int

    session, _, tracker, _ = make_session(['"value": 7', '"value": 8}}\n</tool_call>'])
    tuner = ModelTuner(session)
    with caplog.at_level(logging.DEBUG, logger="ajet.tuner.session"):
        assert asyncio.run(tuner(AS_MESSAGES, structured_model=Answer)).metadata == {"value": 7}
        assert asyncio.run(tuner(AS_MESSAGES, structured_model=Answer)).metadata == {"value": 8}
    assert [c.repaired_tool_calls for c in tracker.calls] == [1, 0]  # the second was complete
    assert session.stats()["tuner/repaired_tool_calls"] == 1
    (debug,) = [r.getMessage() for r in caplog.records if "repaired tool call" in r.getMessage()]
    assert "closed the forced call with '}}</tool_call>'" in debug and '"value": 7' in debug


def test_the_episode_api_refuses_a_non_finite_or_string_reward() -> None:
    from pydantic import ValidationError

    from ajet.serve.protocol import FinishRequest

    assert FinishRequest.model_validate_json('{"reward": 1}').reward == 1.0
    for body in ('{"reward": NaN}', '{"reward": Infinity}', '{"reward": "0.7"}'):
        with pytest.raises(ValidationError, match="reward"):
            FinishRequest.model_validate_json(body)


def test_sft_dialog_line_that_is_not_utf8_names_file_and_line(tmp_path) -> None:
    from ajet.sft.data import DialogDataError, read_dialogs

    path = tmp_path / "dialogs.jsonl"
    good = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    path.write_bytes(good + b"\xff\xfe garbage\n")
    with pytest.raises(DialogDataError, match=r"dialogs.jsonl:2: not valid UTF-8"):
        read_dialogs(path)
