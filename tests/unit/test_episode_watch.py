"""`ajet episode --watch`: which files it watches and which modules it imports again. A
workflow at a project's root must not take the project's virtual env with it."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from ajet.eval import episode as episode_module
from ajet.eval.episode import Tryout, file_stamps, wait_for_change, watched_files


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for rel in ("wf.py", "helper.py", "pkg/__init__.py", "pkg/mod.py", "data/gen.py",
                ".venv/lib/python3.11/site-packages/torchish/__init__.py", ".hidden/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("X = 1\n")
    return tmp_path


def test_watched_files_are_the_workflows_folder_and_its_packages(project: Path) -> None:
    cfg = SimpleNamespace(workflow=SimpleNamespace(target=f"{project / 'wf.py'}:W"))
    files = {p.relative_to(project.resolve()).as_posix() for p in watched_files(cfg)}
    assert files == {"wf.py", "helper.py", "pkg/__init__.py", "pkg/mod.py"}


def test_reload_imports_again_only_the_workflows_own_modules(project: Path, monkeypatch) -> None:
    def module(name: str, rel: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__file__ = str(project / rel)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    module("ajet_test_helper", "helper.py")
    module("ajet_test_pkg.mod", "pkg/mod.py")
    module("ajet_test_torchish", ".venv/lib/python3.11/site-packages/torchish/__init__.py")
    module("ajet_test_gen", "data/gen.py")
    tryout = Tryout.__new__(Tryout)
    tryout.cfg = SimpleNamespace(workflow=SimpleNamespace(target=f"{project / 'wf.py'}:W"))
    closed = []
    tryout.rollout = SimpleNamespace(close=lambda: closed.append(True))
    tryout._rollout = lambda workflow: ("rollout of", workflow)  # type: ignore[method-assign]
    monkeypatch.setattr(episode_module, "_import_workflow", lambda target: "the new workflow")
    tryout.reload()
    assert "ajet_test_helper" not in sys.modules and "ajet_test_pkg.mod" not in sys.modules
    assert "ajet_test_torchish" in sys.modules and "ajet_test_gen" in sys.modules
    assert closed == [True] and tryout.rollout == ("rollout of", "the new workflow")


def test_wait_for_change_returns_the_file_written(project: Path) -> None:
    import os
    import threading

    target, files = project / "helper.py", [project / "wf.py", project / "helper.py"]
    stat = target.stat()
    threading.Timer(0.1, lambda: os.utime(target, (stat.st_atime, stat.st_mtime + 5))).start()
    changed, now = wait_for_change(files, interval_s=0.05)
    assert changed == target and now == file_stamps(files)
    # a save made before the wait (during the episode) counts against the stamps taken before it
    before = file_stamps(files)
    os.utime(files[0], (stat.st_atime, stat.st_mtime + 9))
    assert wait_for_change(files, before, interval_s=0.05)[0] == files[0]


def test_a_save_in_the_same_clock_tick_as_a_half_written_file_is_seen(project: Path) -> None:
    """A save truncates, then writes; on a loaded machine the watch stamped the half-written file
    between the two, its import failed, and the finished file (same mtime: one kernel tick)
    was never imported (the --watch test timed out under 3 workers on 2 cores)."""
    import os

    target, files = project / "helper.py", [project / "wf.py", project / "helper.py"]
    text = target.read_text()
    target.write_text("")  # the half-written file, as the watch saw it
    half = file_stamps(files)
    mtime = target.stat().st_mtime_ns
    target.write_text(text + "\n# saved\n")
    os.utime(target, ns=(mtime, mtime))  # the same tick
    assert wait_for_change(files, half, interval_s=0.05)[0] == target
