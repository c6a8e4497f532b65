"""The CI skip check of tests/conftest.py: with CI=true a skip that tests/skip_allowlist.txt does not
allow fails the session, and says how to fix it; an allowed skip, an xfail, or a run outside CI
does not. Each case runs a tiny suite with a copy of the real conftest (pytester)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

SUITE = """
import pytest

def test_runs():
    assert True

def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU")

@pytest.mark.xfail(reason="a known bug")
def test_known_bug():
    assert False
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """`suite(allowlist, ci=True) -> RunResult`: runs SUITE (test_suite.py) under the real conftest
    with `allowlist` as its skip_allowlist.txt."""
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(test_suite=SUITE)

    def run(allowlist: str, ci: bool = True) -> pytest.RunResult:
        (pytester.path / "skip_allowlist.txt").write_text(allowlist)
        if ci:
            monkeypatch.setenv("CI", "true")
        else:
            monkeypatch.delenv("CI", raising=False)
        return pytester.runpytest("-ra")

    return run


def test_a_skip_outside_the_allowlist_fails_the_ci_run_and_says_how_to_fix(suite) -> None:
    result = suite("test_suite.py::test_other  # some other test\n")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*CI=true: 1 skipped test(s) not in skip_allowlist.txt*",
        "test_suite.py::test_needs_a_gpu: needs a CUDA GPU",
        "*Make it run*add `NODEID-PATTERN  # reason` to skip_allowlist.txt*",
    ])


def test_an_allowed_skip_passes_the_ci_run(suite) -> None:
    result = suite("# comment lines and blank lines are ignored\n\ntest_suite.py::test_needs_*  # no GPU in CI\n")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    assert "not in skip_allowlist.txt" not in result.stdout.str()


def test_outside_ci_a_skip_is_only_reported(suite) -> None:
    result = suite("", ci=False)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["SKIPPED * test_suite.py:*: needs a CUDA GPU"])


def test_a_module_level_importorskip_is_a_skip_too(pytester: pytest.Pytester, suite) -> None:
    pytester.makepyfile(test_broken_install='import pytest\n\npytest.importorskip("no_such_module_ajet")\n')
    result = suite("test_suite.py::test_needs_a_gpu  # no GPU in CI\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["test_broken_install.py: could not import 'no_such_module_ajet'*"])


def test_an_allowlist_line_without_a_reason_is_a_usage_error(suite) -> None:
    result = suite("test_suite.py::test_needs_a_gpu\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*skip_allowlist.txt:1: 'test_suite.py::test_needs_a_gpu' has no reason*"])


def test_every_pattern_of_the_real_allowlist_names_an_existing_test_file() -> None:
    """A renamed or removed test leaves a stale line behind; this finds it."""
    # By path: `import conftest` could be tutorial/conftest.py (both are top-level `conftest`).
    spec = importlib.util.spec_from_file_location("ajet_tests_conftest_allowlist", TESTS / "conftest.py")
    assert spec is not None and spec.loader is not None
    shared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shared)
    patterns = shared.read_skip_allowlist(shared.SKIP_ALLOWLIST)
    assert patterns
    missing = [p for p in patterns if not (REPO / p.split("::")[0].rstrip("*")).is_file()]
    assert not missing, f"{shared.SKIP_ALLOWLIST}: no such test file for {missing}"


CPU_SUITE = """
import pytest

has_bf16_gemm = True  # this machine's type has the feature: the skipif does not fire here

@pytest.mark.skipif(not has_bf16_gemm, reason="needs a CPU with avx512_bf16 or AMX")
def test_bf16_kernel():
    assert True

@pytest.mark.parametrize("dtype", ["float16", pytest.param("bf16", marks=pytest.mark.skipif(
    not has_bf16_gemm, reason="needs AMX"))])
def test_dtype(dtype):
    assert True

@pytest.mark.skipif(False, reason="counts threads in /proc")
def test_linux_only():
    assert True
"""


@pytest.mark.parametrize("has_feature", [True, False])
@pytest.mark.parametrize("ci", [True, False])
def test_a_cpu_feature_skipif_without_an_allowlist_line_fails_whether_or_not_the_machine_has_it(
        pytester: pytest.Pytester, suite, ci: bool, has_feature: bool) -> None:
    pytester.makepyfile(test_cpu=CPU_SUITE.replace("has_bf16_gemm = True", f"has_bf16_gemm = {has_feature}"))
    result = suite("test_suite.py::test_needs_a_gpu  # no GPU in CI\n", ci=ci)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=3, errors=2, skipped=1, xfailed=1)  # test_linux_only: not a CPU feature
    result.stdout.fnmatch_lines([
        "ERROR test_cpu.py::test_bf16_kernel - Failed: this test skips on a CPU*",
        "ERROR test_cpu.py::test_dtype[[]bf16] - Failed: this test skips on a CPU*",
    ])
    result.stdout.fnmatch_lines(["this test skips on a CPU feature ('needs a CPU with avx512_bf16 or AMX') and "
                                 "skip_allowlist.txt has no line for it: *AVX2 only* Add `NODEID-PATTERN  # "
                                 "the feature it needs` to skip_allowlist.txt*"])


def test_a_cpu_feature_skipif_fails_on_an_xdist_worker_too(pytester: pytest.Pytester, suite) -> None:
    pytester.makepyfile(test_cpu=CPU_SUITE)
    (pytester.path / "skip_allowlist.txt").write_text("test_suite.py::test_needs_a_gpu  # no GPU in CI\n")
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=3, errors=2, skipped=1, xfailed=1)


@pytest.mark.parametrize("has_feature", [True, False])
def test_a_cpu_feature_skipif_with_its_allowlist_line_runs_or_skips(
        pytester: pytest.Pytester, suite, has_feature: bool) -> None:
    pytester.makepyfile(test_cpu=CPU_SUITE.replace("has_bf16_gemm = True", f"has_bf16_gemm = {has_feature}"))
    result = suite("test_suite.py::test_needs_a_gpu  # no GPU in CI\n"
                   "test_cpu.py::test_bf16_kernel  # needs avx512_bf16 or AMX\n"
                   "test_cpu.py::test_dtype*bf16]  # needs AMX\n")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=5 if has_feature else 3, skipped=1 if has_feature else 3, xfailed=1)
