"""What the two harness workflows share: the task's repository in the sandbox, the grade and the
harness's failure.

The grade is computed where the agent's code cannot reach it: in a FRESH sandbox, into which the
grader copies the agent's versions of the task's source files (read back from the agent's
sandbox, by name) and writes the task's ORIGINAL tests. So nothing else the agent left behind
counts: not a replaced test file, not a deleted one, not a planted `unittest.py` that the test
command would import. The run must also report the tests the originals hold ("Ran N tests",
N as expected, none skipped): Python 3.11's unittest exits 0 on "Ran 0 tests".
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from ajet.sandbox import RunResult
from ajet.sandbox.box import SandboxRequestError

REPO = "repo"  # the task's files live in /sandbox/repo
REPO_AT = f"/sandbox/{REPO}"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
SKIPPED = re.compile(r"skipped=(\d+)")


def repo_files(task_files: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The task's files (and `extra`, e.g. a harness's config) as paths under /sandbox."""
    return {f"{REPO}/{path}": text for path, text in task_files.items()} | dict(extra or {})


def is_test_file(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.startswith("test") and name.endswith(".py")


def expected_tests(task_files: Mapping[str, str]) -> int:
    """How many tests the task's own test files hold: `test*` methods of their classes."""
    count = 0
    for path, text in task_files.items():
        if is_test_file(path):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef):
                    count += sum(isinstance(item, ast.FunctionDef) and item.name.startswith("test")
                                 for item in node.body)
    return count


@dataclasses.dataclass
class Grade:
    reward: float
    reason: str  # why (the reward is 0.0 unless every original test ran and passed)
    result: RunResult | None = None  # the test run in the grader's sandbox (None: it never ran)

    def text(self, limit: int = 600) -> str:
        return self.reason + ("\n" + self.result.as_tool_text(limit) if self.result else "")

    def metrics(self) -> dict[str, float]:
        """For WorkflowOutput.log_metrics: whether the grader's test run happened (in its own
        sandbox, so it is not among the agent sandbox's `sandbox/calls`), and the reward's cause."""
        return {"grade/tests_ran": float(self.result is not None), "grade/passed": self.reward}


def judge(result: RunResult, expected: int) -> Grade:
    """The reward for a test run: 1.0 only if it passed AND ran the `expected` tests, none skipped."""
    if not result.ok:
        return Grade(0.0, f"the tests did not pass ({result.status}, exit code {result.exit_code})", result)
    output = result.stdout + result.stderr
    ran = [int(n) for n in RAN.findall(output)]
    if not ran:
        return Grade(0.0, "the test run exited 0 but reported no 'Ran N tests' line", result)
    if ran[-1] != expected:
        return Grade(0.0, f"ran {ran[-1]} of the {expected} tests the task holds", result)
    skipped = sum(int(n) for n in SKIPPED.findall(output))
    if skipped:
        return Grade(0.0, f"{skipped} of the {expected} tests were skipped", result)
    return Grade(1.0, f"all {expected} tests passed", result)


def grade(box: Any, task: Mapping[str, Any], pool: Any) -> Grade:
    """Grade the agent's work in `box` (its sandbox): its versions of the task's source files,
    with the task's original tests, in a fresh sandbox from `pool`, by the task's test command."""
    files: Mapping[str, str] = task["files"]
    sources: dict[str, str | bytes] = {}
    for path in files:
        if not is_test_file(path):
            try:
                sources[path] = box.read_file(f"{REPO}/{path}")
            except SandboxRequestError as exc:  # the agent removed it, or made it unreadable
                return Grade(0.0, f"could not read {path} from the agent's sandbox: {exc}")
    originals = {path: text for path, text in files.items() if is_test_file(path)}
    with pool.session_sync({f"{REPO}/{path}": data for path, data in (sources | originals).items()}) as fresh:
        result = fresh.run(f"cd {REPO_AT} && {task['test']}")
    return judge(result, expected_tests(files))


def stderr_tail(text: str, lines: int = 6, width: int = 300) -> str:
    """The last non-empty lines of a harness's stderr, on one line (` | ` between them), for the
    failed episode's message: the run's log shows an episode's failure on one line."""
    plain = ANSI.sub("", text)  # CLI harnesses colour their errors
    tail = [line.strip()[:width] for line in plain.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(tail) or "(no stderr)"


class HarnessFailed(RuntimeError):
    """The harness exited non-zero or never called the model: the episode fails (counted, with
    the harness's last stderr lines), and the run goes on."""
