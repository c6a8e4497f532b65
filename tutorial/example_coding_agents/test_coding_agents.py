"""Two coding-agent harnesses that nobody here wrote, unmodified, fixing tiny repositories in
ajet's sandbox: mini-swe-agent (PyPI) and opencode (npm, `make harnesses`).

- The task set: each task's test fails on its bug and passes on its fix, in the sandbox.
- mini-swe-agent driven by its own deterministic test model: its commands run in the sandbox
  (the fix lands, hostile commands are refused or stopped and counted) and the reward follows.
- opencode driven by a scripted OpenAI-compatible server: the whole harness runs inside the
  sandbox, reaches the model through the bridge only, and its edit earns the reward; a harness
  that fails or never calls the model is a failed episode naming its stderr.
- One training step of each through the real CLI on the tiny model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

HERE = Path(__file__).parent
TASKS = {split: [json.loads(line) for line in (HERE / f"{split}.jsonl").read_text().splitlines()]
         for split in ("train", "val", "test")}


def as_task(row: dict) -> Any:
    from ajet import WorkflowTask

    return WorkflowTask(task_id=row["task_id"], main_query=row["question"], metadata=row)


@pytest.fixture
def pool() -> Iterator[Any]:
    from ajet.sandbox import Limits, SandboxPool

    with SandboxPool(1, Limits(wall_s=3.0, cpu_s=3.0, memory_mb=256)) as sandboxes:
        yield sandboxes


def test_the_tasks_split_by_function_and_each_test_sees_its_bug(example_modules, pool) -> None:
    example_modules(HERE, "coding")
    from coding import expected_tests, grade, repo_files

    functions = {split: {row["task_id"].split("-")[1] for row in rows} for split, rows in TASKS.items()}
    assert not functions["test"] & (functions["train"] | functions["val"])
    assert not functions["val"] & functions["train"]
    assert len(TASKS["train"]) >= 20 and len(TASKS["test"]) >= 8
    for row in TASKS["test"] + TASKS["val"][:4]:
        assert expected_tests(row["files"]) >= 2
        with pool.session_sync(repo_files(row["files"])) as box:
            assert grade(box, row, pool).reward == 0.0, row["task_id"]  # the bug fails its test
            box.write_files(repo_files(row["fixed"]))
            graded = grade(box, row, pool)
            assert graded.reward == 1.0, (row["task_id"], graded.text())


# ----------------------------------------------------------------------- the grade cannot be forged
TOTAL = next(r for r in TASKS["test"] if r["task_id"].startswith("test-total-"))
FAKE_TESTS = ("import unittest\n\n\nclass TestTotal(unittest.TestCase):\n    def test_0(self):\n        pass\n"
              "    def test_1(self):\n        pass\n")


def agent_left(example_modules, pool, files: dict[str, str], remove: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """Grade a sandbox in which the agent wrote `files` (under repo/) and removed `remove`:
    (the grade, what grading by the task's command in the agent's own sandbox would say)."""
    example_modules(HERE, "coding")
    from coding import grade, repo_files

    with pool.session_sync(repo_files(TOTAL["files"])) as box:
        box.write_files(repo_files(files))
        for path in remove:
            box.run(f"rm -f repo/{path}")
        in_place = box.run(f"cd /sandbox/repo && {TOTAL['test']}")
        return grade(box, TOTAL, pool), in_place


def test_deleted_tests_earn_nothing(example_modules, pool) -> None:
    test_file = next(p for p in TOTAL["files"] if p.startswith("test_"))
    graded, in_place = agent_left(example_modules, pool, {}, remove=(test_file,))
    assert in_place.ok and "Ran 0 tests" in in_place.stderr  # the hole: unittest exits 0 on no tests
    assert graded.reward == 0.0 and "did not pass" in graded.reason  # the originals, on the unfixed bug


def test_tests_replaced_by_a_passing_fake_are_graded_by_the_originals(example_modules, pool) -> None:
    test_file = next(p for p in TOTAL["files"] if p.startswith("test_"))
    graded, in_place = agent_left(example_modules, pool, {test_file: FAKE_TESTS})
    assert in_place.ok and "Ran 2 tests" in in_place.stderr  # the fake passes, with the right count
    assert graded.reward == 0.0 and "FAIL" in graded.result.stderr


def test_a_planted_test_runner_is_not_in_the_graders_sandbox(example_modules, pool) -> None:
    forged = "import sys\nprint('Ran 2 tests in 0.001s\\n\\nOK', file=sys.stderr)\nsys.exit(0)\n"
    graded, in_place = agent_left(example_modules, pool, {"unittest.py": forged})
    assert in_place.ok and "Ran 2 tests" in in_place.stderr  # `python3 -m unittest` ran the plant
    assert graded.reward == 0.0 and "FAIL" in graded.result.stderr


@pytest.mark.parametrize("module, reason", [
    ("import os\nos._exit(0)\n", "no 'Ran N tests' line"),           # the run ends before a test
    ("import unittest\nraise unittest.SkipTest('no')\n", "ran 1 of the 2 tests"),  # the test module skipped
])
def test_a_run_that_does_not_run_every_original_test_earns_nothing(example_modules, pool, module, reason) -> None:
    source = next(p for p in TOTAL["files"] if not p.startswith("test_"))
    graded, _ = agent_left(example_modules, pool, {source: module})
    assert graded.reward == 0.0 and reason in graded.reason, graded.text()


def test_a_removed_source_file_earns_nothing(example_modules, pool) -> None:
    source = next(p for p in TOTAL["files"] if not p.startswith("test_"))
    graded, _ = agent_left(example_modules, pool, {}, remove=(source,))
    assert graded.reward == 0.0 and graded.result is None and source in graded.reason


# ------------------------------------------------------------------------------ mini-swe-agent
def mini_run(example_modules, pool: Any, commands: list[str], row: dict) -> tuple[Any, Any, float]:
    """mini-swe-agent's DefaultAgent with its bundled mini.yaml, driven by its own
    DeterministicToolcallModel, in ajet's sandbox environment: (agent, environment, reward)."""
    example_modules(HERE, "coding", "mini_swe_agent")
    from coding import grade, repo_files
    from mini_swe_agent import SandboxEnvironment, mini_config, quiet_imports

    quiet_imports()
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.test_models import DeterministicToolcallModel, make_toolcall_output

    outputs = [make_toolcall_output(None, [{"id": f"c{i}", "type": "function", "function": {
        "name": "bash", "arguments": json.dumps({"command": command})}}], [{"command": command, "tool_call_id": f"c{i}"}])
        for i, command in enumerate(commands)]
    config = mini_config("http://unused", "unused")
    with pool.session_sync(repo_files(row["files"])) as box:
        env = SandboxEnvironment(box, **config["environment"])
        agent = DefaultAgent(DeterministicToolcallModel(outputs=outputs), env, **config["agent"])
        agent.run(row["question"])
        reward = grade(box, row, pool).reward
        env.metrics = box.metrics()
    return agent, env, reward


def test_mini_swe_agent_fixes_the_repo_in_the_sandbox(example_modules, pool) -> None:
    row = next(r for r in TASKS["test"] if r["task_id"].startswith("test-total-"))
    module = next(iter(row["fixed"]))
    fix = f"cat > {module} <<'EOF'\n{row['fixed'][module]}EOF"
    agent, env, reward = mini_run(example_modules, pool, [
        f"cat {module}", fix, "python3 -m unittest -q 2>&1 | tail -1", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"], row)
    assert reward == 1.0
    assert agent.messages[-1]["extra"]["exit_status"] == "Submitted"
    observations = [m["content"] for m in agent.messages if m.get("role") == "tool"]
    assert "result = 1" in observations[0]  # it read the buggy file, in /sandbox/repo
    assert "<returncode>0</returncode>" in observations[2] and "OK" in observations[2]
    assert env.commands == 4 and env.metrics["sandbox/calls"] >= 4


def test_mini_swe_agent_commands_see_the_configured_environment(example_modules, pool) -> None:
    example_modules(HERE, "coding", "mini_swe_agent")
    from mini_swe_agent import SandboxEnvironment

    with pool.session_sync({"repo/a.txt": "x"}) as box:
        env = SandboxEnvironment(box, env={"GREETING": "it's $HOME; `id`"})
        output = env.execute({"command": 'printf "%s|" "$GREETING"; pwd; ls'})
    assert output["output"] == "it's $HOME; `id`|/sandbox/repo\na.txt\n" and output["returncode"] == 0


def test_mini_swe_agent_hostile_commands_are_results_and_counted(example_modules, pool) -> None:
    row = TASKS["test"][0]
    agent, env, reward = mini_run(example_modules, pool, [
        "cat /etc/shadow", "sleep 30", "yes | head -c 100000000", "python3 -c 'import socket; "
        "socket.create_connection((\"1.1.1.1\", 80), timeout=2)'", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"], row)
    observations = [m["content"] for m in agent.messages if m.get("role") == "tool"]
    assert "root:" not in observations[0] and "<returncode>0</returncode>" not in observations[0]
    assert "timeout" in observations[1]
    assert "output_limit" in observations[2]
    assert "Network is unreachable" in observations[3]
    assert reward == 0.0 and agent.messages[-1]["extra"]["exit_status"] == "Submitted"
    assert env.metrics["sandbox/timeouts"] == 1 and env.metrics["sandbox/output_limit"] == 1
    assert env.metrics["sandbox/refused"] >= 2


# ------------------------------------------------------------------------------------ opencode
class Scripted(BaseHTTPRequestHandler):
    """Chat completions, streamed as opencode asks: a bash call with `script`, then (after its
    tool result) a final answer. Every request body is kept in `requests`."""

    script = ""
    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
        if body.get("tools") and body["messages"][-1]["role"] != "tool":
            delta: dict = {"role": "assistant", "tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": self.script, "description": "fix"})}}]}
            finish = "tool_calls"
        else:
            delta, finish = {"role": "assistant", "content": "Fixed."}, "stop"
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "policy",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        last = dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": finish}],
                    usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args: Any) -> None:
        pass


class Tuner:
    """What the opencode workflow asks of ajet's tuner: the endpoint and the episode's timeout."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.session = SimpleNamespace(rollout=SimpleNamespace(episode_timeout_s=60.0))

    def base_url_and_key(self, role: str = "default") -> tuple[str, str]:
        return self.base_url, "episode-key"


@pytest.fixture
def scripted_server() -> Iterator[str]:
    Scripted.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def opencode_installed() -> bool:
    return bool(list((HERE.parents[1] / ".harness" / "node_modules").glob("opencode-linux-*/bin/opencode")))


needs_opencode = pytest.mark.skipif(not opencode_installed(), reason="opencode is not installed: `make harnesses`")


@needs_opencode
def test_opencode_runs_inside_the_sandbox_and_its_fix_earns_the_reward(example_modules, scripted_server) -> None:
    example_modules(HERE, "coding", "opencode_agent")
    from opencode_agent import OpencodeAgent

    row = next(r for r in TASKS["test"] if r["task_id"].startswith("test-total-"))
    module = next(iter(row["fixed"]))
    Scripted.script = (f"cat /proc/sys/kernel/hostname; ls {HERE} 2>&1; sed -i 's/result = 1/result = 0/' {module}; "
                       "python3 -m unittest -q")
    output = OpencodeAgent().execute(as_task(row), Tuner(scripted_server))
    assert output.reward == 1.0, output.metadata
    calls = [r for r in Scripted.requests if r["body"].get("tools")]
    assert len(calls) == 2 and all(r["auth"] == "Bearer episode-key" for r in calls)
    tool_result = calls[1]["body"]["messages"][-1]["content"]
    assert tool_result.startswith("sandbox\n")  # the hostname inside; the repository here is not there
    assert f"cannot access '{HERE}': No such file or directory" in tool_result and "OK" in tool_result
    system = calls[0]["body"]["messages"][0]["content"]
    assert system.startswith("You fix bugs") and "/sandbox/repo" in system
    assert sorted(t["function"]["name"] for t in calls[0]["body"]["tools"]) == ["bash", "edit", "write"]  # write comes with edit
    assert output.log_metrics["harness/connections"] >= 1


@needs_opencode
@pytest.mark.parametrize("script, message", [
    ("echo 'provider ajet: bad config' >&2; exit 3", "exited with error (code 3"),
    ("echo 'nothing to do' >&2; exit 0", "never called the model"),
])
def test_a_harness_that_fails_is_a_failed_episode_naming_its_stderr(example_modules, scripted_server, tmp_path,
                                                                     monkeypatch, script, message) -> None:
    example_modules(HERE, "coding", "opencode_agent")
    from coding import HarnessFailed
    from opencode_agent import OpencodeAgent

    fake = tmp_path / "bin" / "opencode"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("AJET_OPENCODE", str(fake))
    with pytest.raises(HarnessFailed, match="opencode") as failed:
        OpencodeAgent().execute(as_task(TASKS["test"][0]), Tuner(scripted_server))
    assert message in str(failed.value)
    assert ("bad config" if "code 3" in message else "nothing to do") in str(failed.value)


# ------------------------------------------------------------------------------ training steps
@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_mini_swe_agent(one_step) -> None:
    run = one_step(HERE / "mini_swe_agent.yaml", "sandbox.pool_size=1", "rollout.max_tokens=48", "trainer.batch_size=1",
                   "trainer.save_last_checkpoint=true", timeout=600)
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0, {k: v for k, v in metrics.items() if "failed" in k}
    assert metrics["workflow/harness/turns"] >= 1 and "workflow/harness/valid_command_rate" in metrics
    # every episode was graded: the task's tests ran in the grader's own sandbox (not counted in
    # the agent sandbox's sandbox/calls, which the random model's commands may leave at 0)
    assert metrics["workflow/grade/tests_ran"] == 1 and "sandbox/calls" in metrics
    records = run.records(1)
    assert records and all(any(r["loss_mask"]) for r in records)
    assert metrics["context/samples"] <= metrics["context/calls"]


@needs_opencode
@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_opencode(one_step) -> None:
    # opencode's request is ~2,600 tokens with this tokenizer; the tiny model's window is 2,048
    # (the next test), so the window is raised here (a random model does not care).
    run = one_step(HERE / "opencode_agent.yaml", "context.max_model_len=4096", "rollout.episode_timeout_s=120",
                   "trainer.batch_size=1", "trainer.save_last_checkpoint=true", timeout=600)
    metrics = run.assert_completed()
    assert metrics["rollout/ok"] == metrics["rollout/episodes"] == 2, {k: v for k, v in metrics.items() if "fail" in k}
    assert metrics["workflow/harness/connections"] >= 1
    records = run.records(1)
    assert len(records) == metrics["context/samples"] >= 2 and all(any(r["loss_mask"]) for r in records)
    # the recorded prompt is opencode's own request: its `fix` agent's prompt, in its repo
    prompt = "".join(records[0]["tokens"])
    assert "You fix bugs in small Python repositories" in prompt and "Working directory: /sandbox/repo" in prompt


@needs_opencode
@pytest.mark.tutorial
@pytest.mark.integration
def test_opencode_over_the_model_window_fails_naming_the_budget(one_step) -> None:
    # opencode's system prompt alone is over the tiny model's 2048-token window; opencode retries
    # the refused call until its wall clock (the episode's 30 s less a margin) stops it.
    run = one_step(HERE / "opencode_agent.yaml", "rollout.episode_timeout_s=30", "trainer.batch_size=1", timeout=600)
    assert run.returncode != 0 or run.step(1)["rollout/failed"] == run.step(1)["rollout/episodes"]
    assert "HarnessFailed: opencode exited with timeout" in run.stderr
    # ajet's own log names the refusal, whatever the harness printed last: the first refused call
    # of each episode (n=2), then, as the episode ends, how many were refused in all.
    session = [line for line in run.stderr.splitlines() if "WARNING ajet.tuner.session" in line]
    first = [line for line in session if "calls were refused in all" not in line]
    assert len(first) == 2 and len(session) == 4, run.stderr[-3000:]
    assert all("which leaves no room for a completion within the model window (2048 tokens)" in line
               for line in first)
