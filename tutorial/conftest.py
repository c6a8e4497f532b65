"""Fixtures for the tutorial tests: the model fixtures of `tests/conftest.py`, and `one_step`,
which runs an example's YAML for one short training step through the real CLI.

`tests/` is not a package, so its conftest is loaded by path (under its own module name)
and its fixtures re-exported here; `pytest tutorial/` and a plain `pytest` both find them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_tests_conftest() -> Any:
    path = REPO / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("ajet_tests_conftest", path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with the repo
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _load_tests_conftest()
bundled_model_dir = _shared.bundled_model_dir
tiny_model_dir = _shared.tiny_model_dir
vowel_judge = _shared.vowel_judge

# One short step on the tiny model: 2 tasks x 2 episodes, few tokens, no validation,
# one checkpoint at the end, no TensorBoard.
ONE_STEP = (
    "trainer.total_steps=1",
    "trainer.batch_size=2",
    "rollout.n=2",
    "rollout.max_tokens=16",
    "trainer.val_every=0",
    "trainer.save_every=0",
    "logging.tensorboard=false",
)


@dataclass
class StepRun:
    """What one `ajet` run left behind (see docs/outputs.md)."""

    run_dir: Path
    returncode: int
    stderr: str
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        return [row for row in self.metrics if row.get("split") == "train"]

    def step(self, step: int = 1) -> dict[str, Any]:
        rows = [row for row in self.train_rows if row["step"] == step]
        assert rows, f"no train metrics for step {step} in {self.run_dir / 'metrics.jsonl'}"
        return rows[-1]

    def records(self, step: int = 1) -> list[dict[str, Any]]:
        path = self.run_dir / "records" / f"step_{step:06d}.jsonl"
        assert path.is_file(), f"{path} was not written"
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def assert_completed(self) -> dict[str, Any]:
        """The run exited 0 and logged train step 1; failed episodes are counted, not fatal.
        Returns step 1's metrics."""
        assert self.returncode == 0, f"ajet exited {self.returncode}:\n{self.stderr[-4000:]}"
        metrics = self.step(1)
        episodes = metrics["rollout/episodes"]
        assert episodes >= 1
        assert metrics["rollout/ok"] + metrics["rollout/failed"] == episodes
        reasons = {k: v for k, v in metrics.items() if k.startswith("rollout/failed/")}
        assert sum(reasons.values()) == metrics["rollout/failed"], reasons
        assert (self.run_dir / "checkpoints" / "latest").read_text().strip() == "step_000001"
        return metrics


def read_run(run_dir: Path, returncode: int = 0, stderr: str = "") -> StepRun:
    metrics_file = run_dir / "metrics.jsonl"
    rows = []
    if metrics_file.is_file():
        rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line]
    return StepRun(run_dir=run_dir, returncode=returncode, stderr=stderr, metrics=rows)


@pytest.fixture
def one_step_overrides(tiny_model_dir: Path) -> list[str]:
    """The overrides of `one_step` without the output dir, for `ajet.tune(..., overrides=...)`."""
    return [f"model.path={tiny_model_dir}", *ONE_STEP]


@pytest.fixture(name="read_run")
def read_run_fixture():
    """`read_run(run_dir) -> StepRun`, for runs started in-process (`ajet.tune`)."""
    return read_run


class _ForkServer:
    """tests/integration/fork_server.py: ajet, torch and transformers imported once per test
    worker, each run a forked child (a CLI run then costs its own work, not ~5-15 s of imports)."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "integration" / "fork_server.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def run(self, argv: list[str], env: dict[str, str], log: Path, timeout_s: int) -> int:
        request = {"argv": argv, "env": env, "cwd": str(REPO), "log": str(log), "timeout_s": timeout_s}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return int(json.loads(self.proc.stdout.readline())["rc"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def _fork_server():
    """Started on first use by a test worker; one at a time (a worker runs its tests in turn)."""
    holder: list[_ForkServer] = []

    def get() -> _ForkServer:
        if not holder:
            holder.append(_ForkServer())
        return holder[0]

    yield get
    if holder:
        holder[0].close()


@pytest.fixture
def one_step(tmp_path: Path, tiny_model_dir: Path, _fork_server):
    """`one_step(conf, *overrides, env=None, timeout=300) -> StepRun`: `ajet --conf conf` for one
    step on the tiny random model, outputs under tmp_path. The run is a child of a fork server
    (`_fork_server`); `StepRun.stderr` holds its stdout and stderr together."""

    calls = 0

    def run(conf: Path, *overrides: str, env: dict[str, str] | None = None, timeout: int = 300) -> StepRun:
        nonlocal calls
        calls += 1
        exp_dir = tmp_path / f"exp{calls}"
        argv = ["--conf", str(conf), f"model.path={tiny_model_dir}", f"project.exp_dir={exp_dir}", *ONE_STEP,
                *overrides]
        log = tmp_path / f"exp{calls}.log"
        returncode = _fork_server().run(argv, dict(env or {}), log, timeout)
        output = log.read_text(errors="replace") if log.is_file() else ""
        assert returncode != -999, f"ajet {' '.join(argv)} ran past {timeout} s:\n{output[-4000:]}"
        runs = [p for p in exp_dir.iterdir() if p.is_dir()] if exp_dir.is_dir() else []
        assert len(runs) == 1, f"expected one run dir under {exp_dir}, got {runs}:\n{output[-4000:]}"
        return read_run(runs[0], returncode, output)

    return run


@pytest.fixture
def example_modules() -> Any:
    """`use(directory, *names)`: import an example's own modules by their plain names (make_data,
    make_demos, ...). Several examples have modules of the same names, so `directory` goes first
    on sys.path and `names` leave sys.modules now and again after the test (the modules they
    replaced come back)."""
    names: list[str] = []
    saved: dict[str, Any] = {}
    added: list[str] = []

    def use(directory: Path, *modules: str) -> None:
        sys.path.insert(0, str(directory))
        added.append(str(directory))
        for name in modules:
            names.append(name)
            if name in sys.modules:
                saved.setdefault(name, sys.modules.pop(name))

    yield use
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(saved)
    for directory in added:
        sys.path.remove(directory)
