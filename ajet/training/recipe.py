"""The recipe runner: `setup -> train -> cleanup`, the same for every recipe (RL, SFT, DPO).

`setup(closers)` builds what the run needs and registers a closer for each thing it starts
(engine, gateway, Ray workers, metrics sinks) as soon as it has started it. `cleanup` closes
them in reverse order and always runs: after training, after an error or Ctrl-C, and also
when `setup` itself failed halfway (setup runs inside the `try`). Memory freed by an earlier
run in the process (a pipeline's previous stage) goes back to the OS before setup, and this
run's after cleanup; during `train` the garbage collector skips what setup built
(`ajet.training.memory.long_lived_frozen`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ajet.training.memory import long_lived_frozen, release_memory

log = logging.getLogger(__name__)


class Closers:
    """What a recipe started, to close in reverse order."""

    def __init__(self) -> None:
        self._closers: list[tuple[str, Callable[[], object]]] = []

    def push(self, close: Callable[[], object], name: str = "") -> None:
        self._closers.append((name or getattr(close, "__qualname__", repr(close)), close))

    def close_all(self) -> None:
        """Close everything, newest first; a failing closer is logged and the rest still close."""
        while self._closers:
            name, close = self._closers.pop()
            try:
                close()
            except Exception:  # noqa: BLE001 - keep closing the rest, but say what failed
                log.exception("error while shutting down %s", name)


class Recipe(Protocol):
    def setup(self, closers: Closers) -> None:
        """Build the run; push a closer for everything started."""

    def train(self) -> Path:
        """Train; return the run directory."""


def run_recipe(recipe: Recipe) -> Path:
    """setup -> train -> cleanup; cleanup always runs, even when setup fails halfway."""
    release_memory()
    closers = Closers()
    try:
        recipe.setup(closers)
        with long_lived_frozen():  # each step's garbage collections skip what lives for the run
            return recipe.train()
    finally:
        closers.close_all()
        release_memory()
