"""`ajet` re-executes itself once with jemalloc preloaded (ajet.cli.allocator), and the memory
levers of ajet.training.memory follow whichever malloc serves the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ajet.cli import allocator
from ajet.cli.allocator import AllocatorChoiceError, reexec_plan

ROOT = Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    monkeypatch.setattr(allocator, "has_nvidia_gpu", lambda: False)


def test_the_plan_preloads_jemalloc_and_remembers_what_the_environment_had():
    env = reexec_plan({"PATH": "/bin"}, platform="linux")
    assert env is not None
    assert env["LD_PRELOAD"] == allocator.jemalloc_path()
    assert "jemalloc" in env["LD_PRELOAD"]
    assert "MALLOC_CONF" not in env  # jemalloc's own defaults
    assert env[allocator._WAS_PRELOAD] == "-"
    assert env["PATH"] == "/bin"


def test_the_plan_keeps_the_users_preload_and_malloc_conf():
    env = reexec_plan({"LD_PRELOAD": "/opt/libhook.so", "MALLOC_CONF": "narenas:1"}, platform="linux")
    assert env is not None
    assert env["LD_PRELOAD"].endswith(":/opt/libhook.so") and "jemalloc" in env["LD_PRELOAD"]
    assert env["MALLOC_CONF"] == "narenas:1"
    assert env[allocator._WAS_PRELOAD] == "+/opt/libhook.so"


@pytest.mark.parametrize("environ, platform", [
    ({"AJET_ALLOCATOR": "system"}, "linux"),
    ({"AJET_ALLOCATOR": " System "}, "linux"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}, "linux"),
    ({"LD_PRELOAD": "/x/libjemalloc.so.2 /y/libother.so"}, "linux"),
    ({}, "darwin"),
])
def test_no_reexec_where_the_user_chose_or_it_cannot_apply(environ, platform):
    assert reexec_plan(environ, platform=platform) is None


def test_an_unknown_choice_is_refused_with_the_choices():
    with pytest.raises(AllocatorChoiceError, match="AJET_ALLOCATOR='tcmalloc': use one of auto, jemalloc, system"):
        reexec_plan({"AJET_ALLOCATOR": "tcmalloc"}, platform="linux")


def test_auto_keeps_the_system_allocator_on_a_gpu_machine_and_jemalloc_is_asked_for_by_name(monkeypatch):
    monkeypatch.setattr(allocator, "has_nvidia_gpu", lambda: True)
    assert reexec_plan({}, platform="linux") is None
    assert reexec_plan({"AJET_ALLOCATOR": "auto"}, platform="linux") is None
    env = reexec_plan({"AJET_ALLOCATOR": "jemalloc"}, platform="linux")
    assert env is not None and "jemalloc" in env["LD_PRELOAD"]


def test_without_jemalloc_the_process_runs_on_and_says_so_when_it_was_asked_for(monkeypatch, capsys):
    monkeypatch.setattr(allocator, "jemalloc_path", lambda: None)
    assert reexec_plan({}, platform="linux") is None
    assert capsys.readouterr().err == ""
    assert reexec_plan({"AJET_ALLOCATOR": "jemalloc"}, platform="linux") is None
    assert "AJET_ALLOCATOR=jemalloc, but none is found" in capsys.readouterr().err


def test_the_reexecuted_process_puts_the_environment_back():
    environ = {"LD_PRELOAD": "/ray/libjemalloc.so:/opt/libhook.so", allocator._WAS_PRELOAD: "+/opt/libhook.so",
               "HOME": "/root"}
    assert reexec_plan(environ, platform="linux") is None
    assert environ == {"LD_PRELOAD": "/opt/libhook.so", "HOME": "/root"}
    environ = {"LD_PRELOAD": "/ray/libjemalloc.so", allocator._WAS_PRELOAD: "-", "HOME": "/root"}
    assert reexec_plan(environ, platform="linux") is None
    assert environ == {"HOME": "/root"}


PROBE = textwrap.dedent("""
    import os, subprocess, sys
    print("pid", os.getpid(), flush=True)
    from ajet.cli.allocator import use_jemalloc
    use_jemalloc()
    from ajet.training.memory import allocator, limit_heap_retention, release_memory
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD'))"],
                           capture_output=True, text=True).stdout.strip()
    print("pid", os.getpid())
    print("allocator", allocator())
    print("threshold", limit_heap_retention(1 << 20))
    print("release", release_memory())
    print("env", os.environ.get("LD_PRELOAD"), os.environ.get("MALLOC_CONF"), child)
""")


def _probe(**env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", "AJET_ALLOCATOR")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env={**environ, "AJET_ALLOCATOR": "jemalloc", **env}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_process_reexecutes_itself_under_jemalloc_keeping_its_pid_and_its_childrens_environment():
    lines = _probe()
    # Before the exec, at the re-executed start, after: one process id, and the exec happened once.
    assert lines[0] == lines[1] == lines[2] and lines[0].startswith("pid ")
    assert lines[3:] == ["allocator jemalloc", "threshold False", "release True", "env None None None"]


def test_with_the_system_allocator_the_glibc_levers_apply():
    lines = _probe(AJET_ALLOCATOR="system")
    assert lines[0] == lines[1] and len(lines) == 6
    assert lines[2:] == ["allocator glibc", "threshold True", "release True", "env None None None"]


def test_the_cli_refuses_an_unknown_allocator_in_one_line():
    done = subprocess.run([sys.executable, "-m", "ajet.cli.main", "config"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "AJET_ALLOCATOR": "bogus"}, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ajet: AJET_ALLOCATOR='bogus': use one of auto, jemalloc, system (auto: jemalloc where no GPU is, faster "
        "training steps on a CPU; system: the C library's malloc)"]
