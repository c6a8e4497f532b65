"""scripts/bench/suite.py: the command it times is the Makefile's, and its tables read a JUnit
report (the slowest tests and files, named as pytest names them)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.integration.test_chaos" name="test_run" time="200.5"/>
<testcase classname="tests.unit.test_x.TestY" name="test_a[1]" time="1.5"/>
<testcase classname="tests.unit.test_x.TestY" name="test_a[2]" time="2.0"/>
<testcase classname="tutorial.example_math_agent.test_math_agent" name="test_one_step" time="9.0"/>
</testsuite></testsuites>"""


def test_it_times_what_make_runs(script) -> None:
    bench = script("bench.suite")
    makefile = (REPO / "Makefile").read_text()
    xdist = re.search(r"^XDIST = .*,(-n \$\(TEST_WORKERS\)[^)]*)\)$", makefile, re.M).group(1)
    command = " ".join(bench.pytest_command("main", 2, Path("j.xml")))
    assert xdist.replace("$(TEST_WORKERS)", "2") in command
    assert "--ignore=tests/backbones" in command and "-p no:xdist" in " ".join(bench.pytest_command("fast", 0, Path("j")))
    fast = re.search(r"^test-fast:.*\n\t(.*)$", makefile, re.M).group(1)
    assert '-m "not integration and not tutorial"' in fast and bench.SUITES["fast"][-1] == "not integration and not tutorial"


def test_tables_name_tests_and_files_as_pytest_does(script, tmp_path: Path, capsys) -> None:
    bench = script("bench.suite")
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    bench.print_tables(junit, top=2)
    out = capsys.readouterr().out
    assert "4 tests, 213 s in all" in out
    assert "| 200.5 | tests/integration/test_chaos.py::test_run |\n| 9.0 | tutorial/example_math_agent/test_math_agent.py::test_one_step |" in out
    assert "| 3.5 | tests/unit/test_x.py |" not in out  # only the top 2 files
    bench.print_tables(junit, top=3)
    assert "| 3.5 | tests/unit/test_x.py |" in capsys.readouterr().out
