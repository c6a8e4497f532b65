"""How long the test suite takes, and where: the wall time of one pytest run (the main suite as
`make test-main` runs it, or `make test-fast`'s unit tests), its CPU time, and the slowest
tests and files, from pytest's JUnit report.

    .venv/bin/python -m scripts.bench.suite [--suite main|fast] [--workers 3] [--cpu-isa avx2]
                                            [--top 20] [--junit FILE]

--cpu-isa caps the instruction sets as scripts/bench/engine.py does (ATen's dispatch, oneDNN,
MKL, FBGEMM), to estimate on an AVX-512 or AMX machine what the AVX2-only type takes; the
tests that need avx512_bf16 or AMX then skip, as they do there. --workers 0 runs serially.
--junit FILE only prints the tables of an earlier run's report. Name the CPU (`lscpu`) beside
every figure: the machine types differ.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from scripts.bench.common import CPU_ISA, REPO, markdown_table

# What the Makefile's test-main and test-fast run (keep in step with its XDIST and targets).
SUITES = {"main": ["--ignore=tests/backbones"],
          "fast": ["--ignore=tests/backbones", "-m", "not integration and not tutorial"]}


def pytest_command(suite: str, workers: int, junit: Path) -> list[str]:
    xdist = (["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"] if workers
             else ["-p", "no:xdist"])
    return [sys.executable, "-m", "pytest", *SUITES[suite], *xdist, "-q", f"--junitxml={junit}"]


def run(command: list[str], env: dict[str, str]) -> tuple[int, float, float, str]:
    """(exit code, wall seconds, CPU seconds of the run and its children, the last lines)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.returncode, wall, cpu, "\n".join((done.stdout + done.stderr).splitlines()[-3:])


def durations(junit: Path) -> list[tuple[float, str]]:
    """(seconds, nodeid-like name) of each test case: setup + call + teardown."""
    cases = ET.parse(junit).iter("testcase")
    return sorted(((float(c.get("time", 0)), f"{nodeid_path(c.get('classname', ''))}::{c.get('name')}")
                   for c in cases), reverse=True)


def nodeid_path(classname: str) -> str:
    """JUnit's `tests.unit.test_x` (a module) or `tests.unit.test_x.TestY` (a class) as a path."""
    parts = classname.split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "/".join(parts[:module + 1]) + ".py" + "".join(f"::{p}" for p in parts[module + 1:])


def print_tables(junit: Path, top: int) -> None:
    tests = durations(junit)
    by_file: dict[str, float] = defaultdict(float)
    for seconds, name in tests:
        by_file[name.split("::")[0]] += seconds
    print(f"\n{len(tests)} tests, {sum(s for s, _ in tests):.0f} s in all (summed over workers)")
    slowest_files = sorted(by_file.items(), key=lambda kv: -kv[1])[:top]
    for what, rows in ((f"slowest {top} tests", [(f"{s:.1f}", name) for s, name in tests[:top]]),
                       (f"slowest {top} files", [(f"{s:.1f}", name) for name, s in slowest_files])):
        print("", *markdown_table(["seconds", what], rows, right={0}), sep="\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="main")
    parser.add_argument("--workers", type=int, default=3, help="pytest-xdist workers (the Makefile's TEST_WORKERS); 0: serial")
    parser.add_argument("--cpu-isa", choices=sorted(CPU_ISA), default="native")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--junit", type=Path, default=None, help="only print an earlier report's tables")
    args = parser.parse_args()
    if args.junit:
        print_tables(args.junit, args.top)
        return 0
    junit = Path(tempfile.mkdtemp(prefix="ajet-bench-suite-")) / "junit.xml"
    env = os.environ | CPU_ISA[args.cpu_isa] | {"CI": "true"}  # CI=true: the skip guard as in CI
    rc, wall, cpu, tail = run(pytest_command(args.suite, args.workers, junit), env)
    print(*markdown_table(["suite", "workers", "cpu-isa", "exit", "wall", "CPU (user+sys)"],
                          [[args.suite, str(args.workers), args.cpu_isa, str(rc), f"{wall / 60:.1f} min",
                            f"{cpu / 60:.1f} min"]], right={1, 3, 4, 5}), sep="\n")
    print(tail)
    if junit.is_file():
        print_tables(junit, args.top)
        print(f"\nJUnit report: {junit}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
