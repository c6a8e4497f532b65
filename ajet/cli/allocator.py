"""The memory allocator of an `ajet` process: jemalloc where one is at hand (Linux).

A training step on a CPU allocates and frees the same few activation sizes thousands of times
(the bundled model's ~1,100-token packs: 1-4 MB each, ~7 GB a step). glibc's malloc maps each
block of at least its threshold on its own (`trainer.malloc_mmap_threshold_kb`, which keeps its
resident set near the live tensors) and pays a page fault per 4 KB page every time; jemalloc
reuses freed extents within a size class and returns them to the OS after a delay. The demo's
SFT step bench (`python -m scripts.bench.sft_step --steps 4`, Intel Xeon AMX, 2 cores): 6.69 s a
step under glibc (20.6 M page faults, 39 s of system time), 4.25 s under jemalloc (5.2 M, 13 s),
with the same peak RSS (3.04 / 3.06 GB); docs/log/2026-12-07_jemalloc.md.

jemalloc cannot replace malloc in a running process, so `ajet` re-executes itself once at its
start with jemalloc in `LD_PRELOAD` (the same process id: signals and supervisors see one
process). The library is the one ray's wheel ships (ray is one of ajet's dependencies; its
object store preloads it), else the system's `libjemalloc.so.2` (Debian: libjemalloc2), with its
own defaults (`MALLOC_CONF` reaches it unchanged; shorter decays, fewer arenas and a background
thread measured no better: the log above). The re-executed process puts `LD_PRELOAD` back as it
was, so the processes it starts (the sandbox, agents, Ray workers) get the environment the user
gave.

`AJET_ALLOCATOR` chooses: `auto` (the default) is jemalloc on a machine without an NVIDIA GPU
(where the training step runs on the CPU; the GPU backbones' processes keep what they were tested
with), `jemalloc` everywhere (a line says so where none is found), `system` the C library's malloc
with the glibc levers of `ajet.training.memory`. A `LD_PRELOAD` that already names an allocator
is left alone.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import sys
from pathlib import Path

ENV = "AJET_ALLOCATOR"
CHOICES = ("auto", "jemalloc", "system")
# Set in the re-executed process: what LD_PRELOAD was before ("-": unset, "+VALUE": VALUE).
_WAS_PRELOAD = "_AJET_ALLOCATOR_WAS_LD_PRELOAD"
_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc", "tbbmalloc")


class AllocatorChoiceError(ValueError):
    """AJET_ALLOCATOR names no allocator ajet knows."""


def choice(environ: dict[str, str] | os._Environ = os.environ) -> str:
    value = environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise AllocatorChoiceError(f"{ENV}={environ.get(ENV)!r}: use one of {', '.join(CHOICES)} (auto: jemalloc "
                                   f"where no GPU is, faster training steps on a CPU; system: the C library's malloc)")
    return value


def has_nvidia_gpu() -> bool:
    """An NVIDIA device node, without importing torch (this runs before anything is imported)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def jemalloc_path() -> str | None:
    """The jemalloc shared library to preload: ray's, else the system's; None if neither is found."""
    try:
        spec = importlib.util.find_spec("ray")  # finds the package without importing it (~1 s)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "core" / "libjemalloc.so"
        if candidate.is_file():
            return str(candidate)
    return ctypes.util.find_library("jemalloc")  # a soname (libjemalloc.so.2): the loader finds it on its path


def preloads_an_allocator(preload: str) -> bool:
    names = [Path(part).name for part in preload.replace(" ", ":").split(":") if part]
    return any(allocator in name for name in names for allocator in _ALLOCATORS)


def _restore(environ: dict[str, str] | os._Environ) -> None:
    value = environ.pop(_WAS_PRELOAD)
    if value.startswith("+"):
        environ["LD_PRELOAD"] = value[1:]
    else:
        environ.pop("LD_PRELOAD", None)


def reexec_plan(environ: dict[str, str] | os._Environ, platform: str = sys.platform) -> dict[str, str] | None:
    """The environment to re-execute this process in, with jemalloc preloaded; None to run on as
    it is (already re-executed, not Linux, `AJET_ALLOCATOR=system`, another allocator preloaded, or
    no jemalloc here). Puts the variables back in `environ` when this is the re-executed process."""
    if _WAS_PRELOAD in environ:
        _restore(environ)
        return None
    chosen = choice(environ)
    if platform != "linux" or chosen == "system" or (chosen == "auto" and has_nvidia_gpu()):
        return None
    preload = environ.get("LD_PRELOAD", "")
    if preloads_an_allocator(preload):
        return None
    path = jemalloc_path()
    if path is None:
        if chosen == "jemalloc":
            print(f"ajet: {ENV}=jemalloc, but none is found (ray's wheel or the system's libjemalloc2): running on "
                  f"the C library's malloc", file=sys.stderr)
        return None
    env = dict(environ)
    env[_WAS_PRELOAD] = "+" + preload if "LD_PRELOAD" in environ else "-"
    env["LD_PRELOAD"] = f"{path}:{preload}" if preload else path
    return env


def use_jemalloc() -> None:
    """At the start of `ajet` (and of a bench that should measure what `ajet` runs): re-execute
    this process with jemalloc preloaded, once (see the module's doc). Returns if it does not."""
    env = reexec_plan(os.environ)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as exc:  # the process goes on as it is
        print(f"ajet: could not re-execute with jemalloc ({exc}); running on the C library's malloc", file=sys.stderr)
