"""Giving freed memory back to the OS between the phases of a run (glibc only).

A training step frees gigabytes (activations, logits, their gradients) in tensors of a few
MB each. glibc's malloc serves allocations below its mmap threshold (which adapts up to
32 MB) from heap arenas and keeps what is freed there for reuse, so the resident set after
an update stays near the update's peak and grows with fragmentation across steps.
`malloc_trim(0)` returns the free pages of every arena. `release_memory()` runs a garbage
collection first (a freed model of an earlier pipeline stage may sit in a reference cycle).
On other C libraries it only collects garbage.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
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


def release_memory() -> bool:
    """Collect garbage and return free heap pages to the OS; True if malloc_trim ran."""
    gc.collect()
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
