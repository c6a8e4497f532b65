"""Giving freed memory back to the OS (glibc's malloc, or jemalloc).

A training step frees gigabytes (activations, logits, their gradients) in tensors of a few
MB each, and decoding frees a batch's logits and KV buffers as it goes. glibc's malloc serves
allocations below its mmap threshold from heap arenas and keeps what is freed there for
reuse; the threshold adapts upwards (to 32 MB) each time a mapped block is freed, so soon
nearly every tensor lives in the heap. The resident set then stays near each phase's peak
plus fragmentation: in `make demo` a GRPO update started ~1 GB above its live memory with
what the rollout had freed, and ended its backward ~1 GB above it again.

Three levers:
- `limit_heap_retention(bytes)` (`trainer.malloc_mmap_threshold_kb`) fixes the threshold:
  every allocation at least that large gets its own mapping and goes back to the OS the
  moment it is freed, so RSS follows the live tensors. The price is a page fault per 4 KB
  page of each such allocation when it is first written.
- `step_heap_retention(step_bytes, bytes)` (`trainer.malloc_step_mmap_threshold_kb`) raises the
  threshold while a training step runs: the step's activations are reused from the heap without
  a page fault, and the heap's free pages go back to the OS as the step ends.
- `release_memory()`: a garbage collection (a freed model of an earlier pipeline stage may
  sit in a reference cycle), then `malloc_trim(0)`, which returns the free pages of every
  arena: what stays below the threshold.
On other C libraries both do nothing but collect garbage. Under jemalloc (what `ajet` preloads
where it can: `ajet.cli.allocator`) the thresholds do not apply (jemalloc reuses freed extents of
a size class and returns them to the OS after `dirty_decay_ms`), and `release_memory()` purges
every arena's freed pages at once (`arena.<all>.purge`).

The garbage collection itself is cheap only if it skips what lives for the whole run: the
modules torch, transformers and AgentScope import hold ~530,000 objects, and one full
collection over them took 0.4 s (Intel AMX machine) while a step's own garbage takes
milliseconds. `long_lived_frozen()` moves what exists once a recipe is set up out of the
collector's sight for its training (`gc.freeze`) and back at its end, so that an earlier
pipeline stage's model, in a reference cycle, is still collected before the next stage.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Iterator
from functools import cache

log = logging.getLogger(__name__)


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, if its malloc serves this process (not another allocator preloaded over it)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 - glibc only; musl and macOS have no malloc_trim
        serving = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    except (OSError, AttributeError, TypeError):
        return None
    return libc if serving == ctypes.cast(libc.malloc, ctypes.c_void_p).value else None


@cache
def _jemalloc() -> ctypes.CDLL | None:
    """The process's symbols if jemalloc serves malloc (preloaded or linked): its `mallctl`."""
    try:
        process = ctypes.CDLL(None)
        mallctl = process.mallctl
    except (OSError, AttributeError):
        return None
    mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    mallctl.restype = ctypes.c_int
    return process


def allocator() -> str:
    """Which malloc serves this process: "jemalloc", "glibc" or "other"."""
    if _jemalloc() is not None:
        return "jemalloc"
    return "glibc" if _libc() is not None else "other"


# mallopt's parameter number for the mmap threshold (glibc malloc.h).
_M_MMAP_THRESHOLD = -3
# jemalloc's MALLCTL_ARENAS_ALL: "arena.4096.purge" purges every arena.
_JEMALLOC_ARENAS_ALL = 4096


def limit_heap_retention(threshold_bytes: int) -> bool:
    """Serve allocations of at least `threshold_bytes` from their own mappings, returned to the OS
    when freed (glibc's M_MMAP_THRESHOLD, which also stops its dynamic adjustment). 0 leaves
    malloc as it is. Process-wide and lasting; True if the setting was applied (never where another
    allocator, e.g. jemalloc, serves malloc: `_libc` is None there)."""
    if threshold_bytes <= 0:
        return False
    libc = _libc()
    if libc is None:
        return False
    if not libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)):
        raise ValueError(f"malloc refused an mmap threshold of {threshold_bytes} bytes")
    log.debug("malloc: allocations of %d bytes or more are mapped on their own", threshold_bytes)
    return True


@contextlib.contextmanager
def step_heap_retention(step_threshold_bytes: int, threshold_bytes: int) -> Iterator[None]:
    """Within the block (a training step), allocations below `step_threshold_bytes` come from the
    heap, where a freed block is reused without a page fault; outside it `threshold_bytes` holds
    (`limit_heap_retention`), and the heap's free pages go back to the OS as the block ends.

    A step allocates and frees the same few activation sizes thousands of times (the bundled
    model's 1,100-token packs: 1.3-3.4 MB each; ~7 GB of 1-4 MB blocks a step): mapped on their
    own, each is faulted in again at every allocation. The demo's SFT step bench (4 steps) took
    9.9 s a step with 51 s of system time at 1 MB, 7.4 s with 12 s at 4 MB (Intel AMX machine,
    2 cores), while a rollout stays at the tighter threshold: after steps at 4 MB, rollouts at
    1 MB still peaked up to 0.6 GB higher than before (the KV rows they keep, 256-512 KB each,
    land between the step's freed blocks), at 256 KB they did not in one run, and a fresh-clone
    demo then peaked 0.23 GiB higher than without the lever (docs/log/2026-12-06_demo_three_minutes.md):
    it is off by default (`trainer.malloc_step_mmap_threshold_kb: 0`). Nothing
    changes unless both are set and the step's is larger: 0 (glibc's adaptive threshold) cannot
    be restored once a threshold is fixed."""
    if threshold_bytes <= 0 or step_threshold_bytes <= threshold_bytes or not limit_heap_retention(step_threshold_bytes):
        yield
        return
    try:
        yield
    finally:
        limit_heap_retention(threshold_bytes)
        _trim_heap()


def release_memory() -> bool:
    """Collect garbage and return free heap pages to the OS; True if malloc_trim or jemalloc's purge ran."""
    gc.collect()
    return _trim_heap()


def _trim_heap() -> bool:
    """Return the free pages of every malloc arena to the OS; True if malloc_trim (glibc) or
    jemalloc's purge ran."""
    jemalloc = _jemalloc()
    if jemalloc is not None:
        status: int = jemalloc.mallctl(f"arena.{_JEMALLOC_ARENAS_ALL}.purge".encode(), None, None, None, 0)
        return status == 0
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


@contextlib.contextmanager
def long_lived_frozen() -> Iterator[None]:
    """Inside: what exists now (imports, model, optimizer) is left out of garbage collections
    (`gc.freeze` after a last collection); at the end it is collectable again."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
