"""The bundled model's conversion in a process of its own (ajet.cli.convert_model): a run waits for
the process that converts, the process starts only where a conversion is due, and a stopped one
leaves nothing half-written behind."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ajet.cli import convert_model
from ajet.config.schema import AjetConfig
from ajet.launcher import stop_process_group
from ajet.models import resolve

# A process that holds the conversion's lock, says so, and marks the checkpoint complete.
HOLDER = """
import sys, time
from ajet.models import resolve
target = resolve.bundled_target(sys.argv[1])
target.parent.mkdir(parents=True, exist_ok=True)
with resolve._file_lock(target.parent / f".{target.name}.lock"):
    print("locked", flush=True)
    time.sleep(1.0)
    target.mkdir()
    (target / ".complete").write_text("ok\\n")
"""


def bundled_config(cache: Path) -> AjetConfig:
    cfg = AjetConfig()
    cfg.model.path = resolve.BUNDLED_NAME
    cfg.model.cache_dir = str(cache)
    return cfg


def test_a_run_waits_for_the_process_that_converts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    def converted_twice(*args: object) -> None:
        raise AssertionError("the waiting process converted too")

    monkeypatch.setattr(resolve, "_convert_gguf", converted_twice)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.INFO, logger="ajet.models.resolve"):
            start = time.monotonic()
            assert resolve.bundled_checkpoint(str(tmp_path)) == resolve.bundled_target(str(tmp_path))
        assert time.monotonic() - start > 0.5  # it waited for the holder, it did not convert
    finally:
        assert holder.wait(timeout=60) == 0
    assert f"being converted by another process (pid {holder.pid})" in caplog.text
    assert "converted by another process; waited" in caplog.text


def test_the_process_starts_only_where_a_conversion_is_due(tmp_path: Path) -> None:
    local = tmp_path / "checkpoint"
    local.mkdir()
    (local / "config.json").write_text("{}")
    cfg = bundled_config(tmp_path / "cache")
    cfg.model.path = str(local)
    assert convert_model.background_conversion(cfg.model) is None  # a local checkpoint: nothing to convert
    done = bundled_config(tmp_path / "cache")
    target = resolve.bundled_target(done.model.cache_dir)
    target.mkdir(parents=True)
    (target / ".complete").write_text("ok\n")
    assert convert_model.background_conversion(done.model) is None  # converted already


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_stopped_conversion_leaves_nothing_behind(sigint: str, tmp_path: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """Stopped while it converts (SIGTERM to its own group), also when the run was started with
    SIGINT ignored (a background job of a script), which the process inherits."""
    cfg = bundled_config(tmp_path)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler)
    try:
        child = convert_model.background_conversion(cfg.model)
    finally:
        signal.signal(signal.SIGINT, before)
    assert child is not None
    lock = resolve.bundled_target(str(tmp_path)).parent / f".{resolve.bundled_target(str(tmp_path)).name}.lock"
    deadline = time.monotonic() + 120
    while resolve._lock_holder(lock) != str(child.pid):  # it holds the lock: the conversion began
        assert child.poll() is None and time.monotonic() < deadline, "the conversion never took its lock"
        time.sleep(0.05)
    stop_process_group(child)
    assert child.returncode == 130
    models = resolve.bundled_target(str(tmp_path)).parent
    assert sorted(p.name for p in models.iterdir()) == [lock.name]  # no partial checkpoint
    assert "Traceback" not in capfd.readouterr().err


def test_the_process_is_reaped_as_soon_as_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only when the run ends: before, it stayed a zombie (`<defunct>` in ps) for the whole run."""
    started: list[subprocess.Popen[bytes]] = []

    def quick(model, level="INFO"):  # noqa: ANN001, ANN202 - stands in for the conversion process
        started.append(subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True))
        return started[0]

    monkeypatch.setattr(convert_model, "background_conversion", quick)
    with convert_model.converting_in_background(bundled_config(tmp_path).model):
        deadline = time.monotonic() + 30
        while Path(f"/proc/{started[0].pid}").exists():  # a zombie keeps its /proc entry until reaped
            assert time.monotonic() < deadline, "the ended process was not reaped while the run went on"
            time.sleep(0.05)
        assert started[0].returncode == 0
    assert started[0].returncode == 0  # the way out stops nothing that has ended


def test_a_process_still_running_on_the_way_out_is_stopped_beside_the_reaper(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reaper thread blocks in Popen.wait; the way out's SIGTERM and wait still end the process
    (SIGTERM's status, not the SIGKILL that follows a wait that timed out)."""
    started: list[subprocess.Popen[bytes]] = []

    def slow(model, level="INFO"):  # noqa: ANN001, ANN202 - a conversion that outlives the run
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                        start_new_session=True))
        return started[0]

    monkeypatch.setattr(convert_model, "background_conversion", slow)
    with convert_model.converting_in_background(bundled_config(tmp_path).model):
        assert started[0].poll() is None
    assert started[0].returncode == -signal.SIGTERM
    assert not Path(f"/proc/{started[0].pid}").exists()


def test_a_failed_conversion_says_so_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        assert convert_model.convert(str(blocked)) == 1
    assert "converting the bundled model in the background failed" in caplog.text
    assert "the run converts it itself" in caplog.text


def test_a_conversion_removes_what_a_killed_one_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversion killed before its clean-up (SIGKILL) leaves its temporary directory: the next
    one, holding the lock, removes it."""
    def converted(gguf: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(resolve, "_convert_gguf", converted)
    target = resolve.bundled_target(str(tmp_path))
    left = target.parent / f".{target.name}-killed"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"partial")
    assert resolve.bundled_checkpoint(str(tmp_path)) == target
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([target.name, f".{target.name}.lock"])
    assert (target / "config.json").is_file()


def test_the_lock_holder_named_in_the_log_is_a_pid_or_nothing(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    lock.write_text("4242\n")
    assert resolve._lock_holder(lock) == "4242"
    lock.write_text("4242\nINFO forged log line\n")  # whatever else the file holds stays out of the log
    assert resolve._lock_holder(lock) == ""
    assert resolve._lock_holder(tmp_path / "absent") == ""


def test_a_run_converts_for_the_debug_backbone_and_not_for_a_tinker_service(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--backbone=tinker` trains the service's model (`tinker.base_model`): the bundled
    `model.path` is not loaded, so it is not converted either."""
    import contextlib
    from collections.abc import Iterator

    from typer.testing import CliRunner

    from ajet import pipeline
    from ajet.cli import train

    started: list[str] = []

    @contextlib.contextmanager
    def converting(model: object, level: str = "INFO") -> Iterator[None]:
        started.append(level)
        yield

    monkeypatch.setattr(train, "converting_in_background", converting)
    monkeypatch.setattr(pipeline, "run", lambda *args, **kwargs: None)
    (tmp_path / "agent.py").write_text("from ajet import Workflow, WorkflowOutput\n\n\nclass A(Workflow):\n"
                                       "    async def execute(self, task, tuner):\n        return WorkflowOutput(reward=0.0)\n")
    (tmp_path / "t.jsonl").write_text('{"task_id": "a", "question": "q"}\n')
    conf = tmp_path / "run.yaml"
    conf.write_text(f"workflow: {{target: agent.py:A}}\ntask_reader: {{jsonl: {{train_path: t.jsonl}}}}\n"
                    f"model: {{path: {resolve.BUNDLED_NAME}, cache_dir: {tmp_path / 'cache'}, lora: {{enabled: true}}}}\n")
    args = ["--conf", str(conf), "--exp-dir", str(tmp_path / "exp"), "--quiet"]
    for backbone, converted, extra in (("tinker", [], ["tinker.base_model=some/model"]), ("debug", ["INFO"], [])):
        result = CliRunner().invoke(train.app, [*args, "--backbone", backbone, *extra])
        assert result.exit_code == 0, result.output
        assert started == converted, backbone
