"""What the two harness workflows share: the task's repository in the sandbox, the reward (its
unit test, run in the same sandbox after the harness is done) and the episode's metrics."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ajet.sandbox import RunResult

REPO = "repo"  # the task's files live in /sandbox/repo
REPO_AT = f"/sandbox/{REPO}"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def repo_files(task_files: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The task's files (and `extra`, e.g. a harness's config) as paths under /sandbox."""
    return {f"{REPO}/{path}": text for path, text in task_files.items()} | dict(extra or {})


def run_tests(box: Any, command: str) -> tuple[float, RunResult]:
    """(1.0 if the task's test passes in the sandbox else 0.0, what the test run printed)."""
    result = box.run(f"cd {REPO_AT} && {command}")
    return (1.0 if result.ok else 0.0), result


def stderr_tail(text: str, lines: int = 6, width: int = 300) -> str:
    """The last non-empty lines of a harness's stderr, on one line (` | ` between them), for the
    failed episode's message: the run's log shows an episode's failure on one line."""
    plain = ANSI.sub("", text)  # CLI harnesses colour their errors
    tail = [line.strip()[:width] for line in plain.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(tail) or "(no stderr)"


class HarnessFailed(RuntimeError):
    """The harness exited non-zero or never called the model: the episode fails (counted, with
    the harness's last stderr lines), and the run goes on."""
