"""The llama.cpp reference of scripts/bench/engine.py runs in a process of its own: a crash there (a
native build on an AMX CPU dies in its AMX kernels) leaves its column out with the reason, and
the rest of the benchmark goes on."""

from __future__ import annotations

import os
from typing import Any

import pytest


@pytest.fixture
def llamacpp(script: Any) -> Any:
    return script("bench.llamacpp")


def test_the_result_of_the_isolated_run_comes_back(llamacpp: Any) -> None:
    assert llamacpp.bench_isolated([3, 1, 2], target=max) == (3, "")


def test_a_crashed_process_gives_no_column_and_says_why(llamacpp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: {"avx2"})
    runs, why = llamacpp.bench_isolated(target=os.abort)
    assert runs is None
    assert why == "llama.cpp's process died"


def test_on_an_amx_cpu_the_reason_names_the_build_without_amx(llamacpp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: {"avx512f", "amx_tile"})
    runs, why = llamacpp.bench_isolated(target=os.abort)
    assert runs is None
    assert "AMX" in why and "-DGGML_AMX_TILE=OFF" in why and "llama-cpp-python" in why


def test_an_error_in_the_process_is_reported_not_raised(llamacpp: Any) -> None:
    runs, why = llamacpp.bench_isolated("not a number", target=int)
    assert runs is None
    assert why.startswith("llama.cpp failed: ValueError")


def test_the_build_flags_leave_amx_out_only_on_amx_cpus(llamacpp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert llamacpp.build_cmake_args() == ""
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: {"avx512f", "amx_tile", "amx_bf16"})
    assert "-DGGML_AMX_TILE=OFF" in llamacpp.build_cmake_args()
