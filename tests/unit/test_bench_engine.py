"""scripts/bench/engine.py's --cpu-isa: the bench re-runs itself once with the caps in its environment,
and the caps reach torch's kernels (and `engine_dtype: auto`'s choice)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_engine(script: Any) -> Any:
    return script("bench.engine")


def test_cpu_isa_re_runs_the_script_with_the_caps_once(bench_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((argv, env)))
    bench_engine.cap_cpu_isa("native", ["--workloads", "decode"])
    assert not calls
    bench_engine.cap_cpu_isa("avx512_bf16", ["--cpu-isa", "avx512_bf16"])
    (argv, env), = calls
    assert argv[1:] == ["-m", "scripts.bench.engine", "--cpu-isa", "avx512_bf16"]
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16" and env[bench_engine.ISA_MARK] == "avx512_bf16"
    monkeypatch.setenv(bench_engine.ISA_MARK, "avx512_bf16")  # the re-run itself goes on
    bench_engine.cap_cpu_isa("avx512_bf16", ["--cpu-isa", "avx512_bf16"])
    assert len(calls) == 1


@pytest.mark.parametrize("isa", ["avx2", "avx512_bf16"])
def test_the_caps_reach_torchs_kernels_and_auto_follows_them(bench_engine: Any, isa: str) -> None:
    """Under the avx2 caps ATen dispatches AVX2 kernels and oneDNN has no bf16 GEMM; under either
    cap oneDNN is kept below AMX, so `engine_dtype: auto` takes float16 (FBGEMM, x86)."""
    probe = ("import torch\nfrom ajet.engine.weights import fastest_engine_dtype, has_fbgemm\n"
             "print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported(), "
             "fastest_engine_dtype(torch.device('cpu')), has_fbgemm())")
    env = os.environ | bench_engine.CPU_ISA[isa]
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         cwd=REPO, check=True).stdout.split()
    capability, bf16_gemm, auto, fbgemm = out[-4:]
    assert auto == ("float16" if fbgemm == "True" else "float32")
    if isa == "avx2":
        assert capability in ("AVX2", "DEFAULT") and bf16_gemm == "False"
