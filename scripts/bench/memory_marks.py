"""RSS marks inside a running `ajet` (`python -m scripts.bench.memory --marks`): what each part
of a run holds, not just the peak of the whole.

Run as the child of `scripts.bench.memory --marks`: wraps the functions that start and end the
parts of a run (model loads, evaluation and GRPO rollouts, updates, forward, backward, the
optimizer step, gradient clipping, release_memory, checkpoints), then runs the `ajet` CLI.
At each mark it prints one line

    @@mem <seconds> <rss GB> <peak GB since the previous mark> <engine KV GB> <prefix cache GB> <label>

where the peak is the kernel's VmHWM, reset at every mark (`/proc/self/clear_refs`), so it is
the exact peak of the interval that began at the previous mark; the engine columns are the
largest batch KV buffers and prefix cache (tokens x 46 KB, the bundled model) seen in it.
Linux only. The wrappers change no behaviour; a mark costs a /proc read.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
import types
import weakref
from typing import Any

_lock = threading.Lock()
_engines: weakref.WeakSet = weakref.WeakSet()
_start = time.monotonic()
_engine_max = [0, 0]  # KV, prefix cache bytes: the largest seen since the last mark
_CACHE_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # layers x (k, v) x kv heads x head dim x fp32


def _status() -> tuple[int, int]:
    text = open("/proc/self/status").read()  # noqa: SIM115 - one read
    rss, hwm = (int(re.search(rf"{key}:\s+(\d+)", text)[1]) * 1024 for key in ("VmRSS", "VmHWM"))
    return rss, hwm


def _engine_bytes() -> tuple[int, int]:
    kv = cache = 0
    for engine in list(_engines):
        batch = engine._batch.kv
        if batch is not None:
            kv += sum(t.nbytes for t in batch.keys) + sum(t.nbytes for t in batch.values)
        if engine._reuse.cache is not None:
            cache += engine._reuse.cache.tokens * _CACHE_BYTES_PER_TOKEN
    return kv, cache


def mark(label: str) -> None:
    with _lock:
        rss, hwm = _status()
        kv, cache = _engine_bytes()
        kv_max, cache_max = max(_engine_max[0], kv), max(_engine_max[1], cache)
        _engine_max[:] = [kv, cache]
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        print(f"@@mem {time.monotonic() - _start:.2f} {rss / 1e9:.3f} {hwm / 1e9:.3f} {kv_max / 1e9:.3f} "
              f"{cache_max / 1e9:.3f} {label}", flush=True)


def _watch_engines() -> None:
    while True:
        time.sleep(0.05)
        try:
            kv, cache = _engine_bytes()
        except (RuntimeError, AttributeError):  # the engine thread swapped its buffers meanwhile
            continue
        _engine_max[0], _engine_max[1] = max(_engine_max[0], kv), max(_engine_max[1], cache)


def _wrap(owner: Any, name: str, label: str, *, enter: bool = True) -> None:
    """Replace `owner.name` with a marked wrapper; for a module function, also in every loaded
    ajet module that imported it (`from ajet.x import fn` binds the function at the top)."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        if enter:
            mark(f"> {label}")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"< {label}")

    setattr(owner, name, marked)
    if isinstance(owner, types.ModuleType):
        for module in list(sys.modules.values()):
            if module is not None and module.__name__.startswith("ajet") and getattr(module, name, None) is fn:
                setattr(module, name, marked)


def install() -> None:
    import torch
    import torch.optim.optimizer  # noqa: F401 - the module, for its global step hooks

    import ajet.engine.local as engine
    import ajet.eval.runner as eval_runner
    import ajet.forward.packed as packed_forward
    import ajet.models.load as load
    import ajet.pipeline  # noqa: F401 - loads the modules that import the wrapped functions
    import ajet.rl.recipe as rl
    import ajet.rl.update as update
    import ajet.rollout.engine_rollout as rollout
    import ajet.sft.step as sft_step
    import ajet.training.loop as loop
    import ajet.training.memory as memory

    init = engine.LocalEngine.__init__

    def tracked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _engines.add(self)

    engine.LocalEngine.__init__ = tracked_init
    for owner, name, label in [
        (load, "load_model_and_tokenizer", "load model"), (eval_runner, "evaluate", "evaluate"),
        (rollout.EngineRollout, "rollout", "eval rollout"), (rl.RLRecipe, "_rollout", "grpo rollout"),
        (rl.RLRecipe, "update", "grpo update"), (update.PolicyUpdater, "update", "policy update"),
        (packed_forward, "forward_packed", "forward"), (torch.Tensor, "backward", "backward"),
        (torch.nn.utils, "clip_grad_norm_", "clip"), (sft_step, "sft_step", "sft step"),
        (sft_step, "sample_nll", "sft dev loss"), (loop.TrainingLoop, "save_checkpoint", "checkpoint"),
        (loop.TrainingLoop, "save_final_model", "final model"),
    ]:
        _wrap(owner, name, label)
    _wrap(memory, "release_memory", "release_memory", enter=False)
    optim = sys.modules["torch.optim.optimizer"]
    optim.register_optimizer_step_pre_hook(lambda *_: mark("> optimizer.step"))
    optim.register_optimizer_step_post_hook(lambda *_: mark("< optimizer.step"))
    threading.Thread(target=_watch_engines, daemon=True).start()


def parse_mark(line: str) -> dict[str, Any] | None:
    """A mark line as a dict (t, rss, peak, kv, cache in GB; label), or None."""
    if not line.startswith("@@mem "):
        return None
    _, t, rss, peak, kv, cache, label = line.rstrip("\n").split(" ", 6)
    return {"t": float(t), "rss": float(rss), "peak": float(peak), "kv": float(kv), "cache": float(cache),
            "label": label}


def main(argv: list[str]) -> None:
    install()
    mark("start")
    from ajet.cli.main import main as ajet_main

    try:
        ajet_main(argv)
    finally:
        mark("end")


if __name__ == "__main__":
    from ajet.cli.allocator import use_jemalloc

    use_jemalloc()  # the allocator `ajet` runs on (AJET_ALLOCATOR=system: the C library's)
    main(sys.argv[1:])
