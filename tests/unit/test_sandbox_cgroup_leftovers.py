"""A process killed outright leaves its sandbox cgroups behind, named by its pid; a later process
given the same pid must not fail on them (CI hit `FileExistsError: .../pids/ajet-sb-32355-0`), and
the leftovers of dead processes are swept. On a plain directory standing in for a cgroup parent:
an empty directory is an empty group, one whose `cgroup.procs` lists a pid has a process in it; a
group counts as a leftover once it has been empty for `LEFTOVER_S` (its mtime is set back)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ajet.sandbox import cgroups


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def aged(path: Path, *, procs: str | None = None, seconds: float = cgroups.LEFTOVER_S + 60) -> Path:
    path.mkdir()
    if procs is not None:
        (path / "cgroup.procs").write_text(procs)
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


@pytest.fixture(autouse=True)
def fresh_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "_swept", set())


def test_a_leftover_group_of_this_pid_is_replaced(tmp_path: Path) -> None:
    stale = aged(tmp_path / f"ajet-sb-{os.getpid()}-0")  # a killed process's, whose pid came back
    assert cgroups.make_group(stale) == stale
    assert stale.is_dir() and time.time() - stale.stat().st_mtime < 60  # made anew


def test_a_group_in_use_or_just_made_is_left_alone_and_a_suffixed_name_taken(tmp_path: Path) -> None:
    busy = aged(tmp_path / f"ajet-sb-{os.getpid()}-1", procs="4242\n")
    young = tmp_path / f"ajet-sb-{os.getpid()}-2"
    young.mkdir()  # another pid namespace's sandbox, between its mkdir and moving in
    for taken in (busy, young):
        made = cgroups.make_group(taken)
        assert made != taken and made.name.startswith(taken.name + "-") and made.is_dir()
    assert (busy / "cgroup.procs").read_text() == "4242\n" and young.is_dir()


def test_the_first_group_sweeps_dead_processes_leftovers(tmp_path: Path) -> None:
    dead = dead_pid()
    leftovers = [aged(tmp_path / f"ajet-sb-{dead}-3"), aged(tmp_path / f"ajet-probe-{dead}")]
    kept = [aged(tmp_path / f"ajet-sb-{os.getppid()}-0"),  # a live process's
            aged(tmp_path / f"ajet-sb-{dead}-4", procs="99\n"),  # processes in it
            aged(tmp_path / f"ajet-sb-{dead}-5", seconds=5),  # empty, but only just made
            aged(tmp_path / "someone-else")]
    cgroups.make_group(tmp_path / f"ajet-sb-{os.getpid()}-8")
    assert not any(p.exists() for p in leftovers)
    assert all(p.is_dir() for p in kept)
    assert (tmp_path / f"ajet-sb-{os.getpid()}-8").is_dir()


def test_a_v2_group_is_made_over_a_leftover(tmp_path: Path) -> None:
    aged(tmp_path / f"ajet-sb-{os.getpid()}-9")
    group = cgroups.CgroupV2(f"ajet-sb-{os.getpid()}-9", 512 << 20, 36, parent=tmp_path)
    assert group.dirs == [tmp_path / f"ajet-sb-{os.getpid()}-9"]
    assert (group.dirs[0] / "memory.max").read_text() == str(512 << 20)
