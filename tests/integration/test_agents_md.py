"""AGENTS.md stays true: the commands of its "Try a change" and "Read a run" blocks run as
written (on the tiny model, for time: `model.path` is appended to the ajet commands that load
one, and the run's directory is this test's), and exit 0."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def blocks(text: str, heading: str) -> list[str]:
    """The command lines of the bash block under `## heading`."""
    section = text.split(f"## {heading}\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"AGENTS.md: no bash block under '## {heading}'"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_try_and_read_commands_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    text = (REPO / "AGENTS.md").read_text()
    commands = blocks(text, "Try a change") + blocks(text, "Read a run")
    assert len(commands) == 4 and all(c.startswith(".venv/bin/ajet ") for c in commands)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
    venv_ajet = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "ajet")
    for command in commands:
        argv = shlex.split(command.replace("/tmp/ajet_agents", str(tmp_path)))
        argv[0] = venv_ajet if Path(venv_ajet).exists() else argv[0]
        if "--conf" in argv:  # loads a model
            argv.append(f"model.path={tiny_model_dir}")
        run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        assert run.returncode == 0, f"{command}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    assert (tmp_path / "frozenlake" / "metrics.jsonl").is_file()
    assert list((tmp_path / "frozenlake" / "records").glob("step_*.jsonl"))
