"""`ajet episode` (issue 58 §1): one episode shown as training would see it, the workflow's own
traceback when it raises, --pdb at the exception, and clear errors for a task that is not there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cli import ajet as fork_ajet

pytestmark = pytest.mark.integration

RAISES = '''
from ajet import Workflow, WorkflowOutput


class Raises(Workflow):
    async def execute(self, task, tuner):
        await tuner([{"role": "user", "content": task.main_query}])
        local_value = 41 + 1
        raise RuntimeError(f"boom in {task.task_id}")
'''


def ajet_episode(conf: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    if not stdin:  # a child of the fork server (the imports once); the debugger needs a stdin
        return fork_ajet("episode", "--conf", str(conf), *args, timeout=300, cwd=conf.parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
    return subprocess.run([sys.executable, "-m", "ajet.cli.main", "episode", "--conf", str(conf), *args],
                          input=stdin, capture_output=True, text=True, env=env, timeout=300, cwd=conf.parent)


def test_one_episode_shows_its_calls_tokens_samples_reward_and_times(two_calls_conf: Path) -> None:
    run = ajet_episode(two_calls_conf, "--task", "t1", "--tokens")
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "task t1 (train #1): Count to 3." in out
    assert "episode try-t1-e0: ok, reward 0.250, 2 calls" in out
    assert "call 1 [default]" in out and "call 2 [default]" in out
    assert "user | More." in out  # the second call shows the message it adds
    assert out.count("tokens |") == 2  # each completion, token by token
    assert "samples: 1 from 2 calls" in out  # the second call extends the first: merged
    assert "sample 1 [default]:" in out and "calls [1, 2]" in out
    assert "time: start-up" in out and "imports" in out and "model load" in out and "episodes" in out
    assert "; engine " in out  # what it decoded with: --engine-dtype auto, the fastest here


def test_engine_dtype_float32_and_config_decode_as_a_float32_run(two_calls_conf: Path) -> None:
    for args in (("--engine-dtype", "float32"), ("--engine-dtype", "config")):  # the config's: float32
        run = ajet_episode(two_calls_conf, *args)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "; engine float32, --engine-dtype)" in run.stdout


def test_a_raising_workflow_shows_its_traceback_and_exits_1(two_calls_conf: Path) -> None:
    (two_calls_conf.parent / "raises.py").write_text(RAISES)
    run = ajet_episode(two_calls_conf, "workflow.target=raises.py:Raises")
    assert run.returncode == 1, run.stderr[-3000:]
    assert "episode try-t0-e0: failed, workflow_error:RuntimeError" in run.stdout
    assert 'raise RuntimeError(f"boom in {task.task_id}")' in run.stdout  # its own traceback
    assert "RuntimeError: boom in t0" in run.stdout


def test_pdb_opens_the_debugger_at_the_workflows_exception(two_calls_conf: Path) -> None:
    (two_calls_conf.parent / "raises.py").write_text(RAISES)
    run = ajet_episode(two_calls_conf, "workflow.target=raises.py:Raises", "--pdb", stdin="p local_value\nc\n")
    assert run.returncode == 1, run.stderr[-3000:]
    assert "(Pdb) 42" in run.stdout  # the workflow's frame, its locals alive


def test_a_task_that_is_not_there_is_named(two_calls_conf: Path) -> None:
    run = ajet_episode(two_calls_conf, "--task", "7")
    assert run.returncode != 0 and "--task 7: the train split has 3 tasks (0..2)" in run.stderr
    run = ajet_episode(two_calls_conf, "--task", "nope")
    assert run.returncode != 0 and "no task of the train split has that id (its first ids: t0, t1, t2)" in run.stderr


def test_a_workflow_that_does_not_import_is_named_and_the_engine_it_overlapped_is_closed(
        two_calls_conf: Path) -> None:
    """The engine starts (packing its weights) while the workflow is imported: when the import
    fails, the error names the workflow and the engine started beside it is closed."""
    import threading

    from ajet.config import load_config
    from ajet.errors import AjetError
    from ajet.eval.episode import show_episodes

    (two_calls_conf.parent / "broken.py").write_text("def oops(:\n")
    cfg = load_config(two_calls_conf, [f"workflow.target={two_calls_conf.parent}/broken.py:Broken",
                                       "rollout.engine_dtype=float16"])
    with pytest.raises(AjetError, match="broken.py"):
        show_episodes(cfg)
    assert not [t for t in threading.enumerate() if t.name.startswith(("ajet-engine", "ajet-pack"))]


@pytest.mark.timeout(300)
def test_watch_runs_the_episode_again_after_each_change_and_keeps_the_last_good_workflow(
        two_calls_conf: Path) -> None:
    """`--watch`: the episode, then again with the changed workflow (the model stays loaded); a
    change that does not import is named and the last good workflow stays; Ctrl-C ends it."""
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ajet.cli.main", "episode", "--conf", str(two_calls_conf),
                             "--watch"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=two_calls_conf.parent)
    assert proc.stdout is not None
    agent = two_calls_conf.parent / "agent.py"
    seen: list[str] = []

    def until(text: str) -> None:
        for line in proc.stdout:  # the test's timeout (pytest-timeout) ends a wait that never ends
            seen.append(line)
            if text in line:
                return
        raise AssertionError(f"exited before {text!r}:\n" + "".join(seen[-30:]))

    try:
        until("episode try-t0-e0: ok, reward 0.250, 2 calls")
        until("watching")
        time.sleep(1.1)  # a new mtime
        agent.write_text(agent.read_text() + "\ndef broken(:\n")
        until("importing the workflow again")
        until("SyntaxError")
        agent.write_text(agent.read_text().replace("\ndef broken(:\n", "").replace("reward=0.25", "reward=0.75"))
        until("episode try-t0-e0: ok, reward 0.750, 2 calls")
        until("watching")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
    finally:
        proc.kill()


def test_a_first_run_converts_the_bundled_model_once(two_calls_conf: Path, tmp_path: Path) -> None:
    """On a cold cache the conversion starts in a process of its own beside the run
    (ajet.cli.convert_model); whichever takes the lock first converts, the other waits for it."""
    cache = tmp_path / "cold_cache"
    run = ajet_episode(two_calls_conf, "model.path=smollm2-135m-instruct", f"model.cache_dir={cache}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("converting the bundled model") == 1, run.stderr[-3000:]
    assert "converted by another process; waited" in run.stderr  # the one that did not convert waited
    models = cache / "models"
    assert sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) == ["smollm2-135m-instruct-v2"]
    assert (models / "smollm2-135m-instruct-v2" / ".complete").is_file()
    assert "Traceback" not in run.stderr
