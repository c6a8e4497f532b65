"""Giving freed memory back to the OS (glibc only).

A training step frees gigabytes (activations, logits, their gradients) in tensors of a few
MB each, and decoding frees a batch's logits and KV buffers as it goes. glibc's malloc serves
allocations below its mmap threshold from heap arenas and keeps what is freed there for
reuse; the threshold adapts upwards (to 32 MB) each time a mapped block is freed, so soon
nearly every tensor lives in the heap. The resident set then stays near each phase's peak
plus fragmentation: in `make demo` a GRPO update started ~1 GB above its live memory with
what the rollout had freed, and ended its backward ~1 GB above it again.

Two levers:
- `limit_heap_retention(bytes)` (`trainer.malloc_mmap_threshold_kb`) fixes the threshold:
  every allocation at least that large gets its own mapping and goes back to the OS the
  moment it is freed, so RSS follows the live tensors. The price is a page fault per 4 KB
  page of each such allocation when it is first written.
- `release_memory()`: a garbage collection (a freed model of an earlier pipeline stage may
  sit in a reference cycle), then `malloc_trim(0)`, which returns the free pages of every
  arena: what stays below the threshold.
On other C libraries both do nothing but collect garbage.

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
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 - glibc only; musl and macOS have no malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return libc


# mallopt's parameter number for the mmap threshold (glibc malloc.h).
_M_MMAP_THRESHOLD = -3


def limit_heap_retention(threshold_bytes: int) -> bool:
    """Serve allocations of at least `threshold_bytes` from their own mappings, returned to the OS
    when freed (glibc's M_MMAP_THRESHOLD, which also stops its dynamic adjustment). 0 leaves
    malloc as it is. Process-wide and lasting; True if the setting was applied."""
    if threshold_bytes <= 0:
        return False
    libc = _libc()
    if libc is None:
        return False
    if not libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)):
        raise ValueError(f"malloc refused an mmap threshold of {threshold_bytes} bytes")
    log.debug("malloc: allocations of %d bytes or more are mapped on their own", threshold_bytes)
    return True


def release_memory() -> bool:
    """Collect garbage and return free heap pages to the OS; True if malloc_trim ran."""
    gc.collect()
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
