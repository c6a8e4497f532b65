"""The policy version of the local engine, and its copy of the weights kept at that version.

The trainer updates the weights it shares with the engine in place; the engine only learns of
it through the version. `bump()` says the weights changed (the prefix cache drops KV of older
versions: ajet/engine/prefix_cache.py); `sync()`, on the engine thread before every forward,
refreshes the engine's lower-precision copy (`ServingWeights`, ajet/engine/weights.py) when the
version moved, so stale weights never serve a request. `publish()` is the overlapped update's
(`rollout.max_staleness`): the engine kept decoding its copy of the previous weights while the
trainer changed them; the version is bumped and the copy refreshed at once, inside a pause.

The pausing itself is the scheduler's (ajet/engine/scheduler.py): `LocalEngine` calls these
inside `paused()` where no forward may run meanwhile.
"""

from __future__ import annotations

import logging
import threading

from ajet.engine.weights import ServingWeights

log = logging.getLogger(__name__)


class PolicyVersion:
    """The version of the weights the engine serves (`value`) and the copy kept at it.
    `fixed`: the weights never change (an evaluation); bumping is an error."""

    def __init__(self, weights: ServingWeights, *, fixed: bool = False) -> None:
        self.weights = weights
        self.fixed = fixed
        self.value = 0
        self._lock = threading.Lock()  # bumps come from the trainer's thread, and others

    def bump(self) -> int:
        """The shared weights changed in place: increment and return the version."""
        if self.fixed:
            raise RuntimeError("this engine was built with fixed_weights=True (an evaluation): its weights "
                               "must not change, since 'initial' is served by them")
        with self._lock:
            self.value += 1
            return self.value

    def publish(self) -> int:
        """Bump the version and refresh the copy now (call inside a pause); the new version."""
        if not self.weights.is_copy:
            raise RuntimeError("publish_weights needs an engine with its own copy of the weights "
                               "(engine_dtype float16 or bfloat16); use `with engine.paused(): ... bump_version()`")
        version = self.bump()
        self.weights.refresh(version)
        return version

    def sync(self) -> int:
        """Refresh the engine's copy of the weights if the version moved (engine thread, no
        forward in flight); the version the next forward runs under."""
        version = self.value
        if self.weights.refresh(version):
            log.debug("engine %s weights refreshed for policy version %d", self.weights.dtype, version)
        return version
