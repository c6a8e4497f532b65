"""opencode (npm `opencode-ai`, the CLI coding agent, unmodified) fixes a tiny repository's bug.
The whole harness runs inside ajet's sandbox; its one way out is ajet's model gateway.

    make harnesses                                               # installs opencode under .harness/
    ajet --conf tutorial/example_coding_agents/opencode_agent.yaml --backbone=debug

Each episode starts a sandbox (bubblewrap: no network, a throwaway /sandbox, caps on time,
memory and processes) with the task's repository in /sandbox/repo and opencode's binary
read-only. opencode's shell commands and file edits therefore happen in the sandbox too. Its
model calls go to `ModelBridge.inside_url`, a relay on the sandbox's loopback that reaches
ajet's gateway through a Unix socket (ajet.sandbox.bridge), with the episode's key.

opencode is configured with its own config file only (`opencode_config`): an OpenAI-compatible
provider for ajet, an agent `fix` with a short prompt and the bash/edit tools, no title call,
no update checks or downloads. The reward is the task's original unit test, run on opencode's
edited source files in a fresh sandbox after it exits (coding.grade). A run that exits non-zero or never calls the model is a failed episode
whose message holds opencode's last stderr lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

# The workflow's folder is on sys.path (ajet's workflow loader puts it there).
from coding import REPO_AT, HarnessFailed, grade, repo_files, stderr_tail

from ajet import Workflow, WorkflowOutput, WorkflowTask
from ajet.sandbox import Limits, Sandbox, shared_pool
from ajet.sandbox.bridge import ModelBridge

ROOT = Path(__file__).resolve().parents[2]
HOME_AT = "/sandbox/home"
AGENT_PROMPT = ("You fix bugs in small Python repositories. Read the files with the bash tool "
                "(cat), fix the bug with the edit tool or sed, then run `python3 -m unittest`.")
# Bun reserves far more address space than it uses, so memory is capped over the sandbox
# (cgroup), not per process.
LIMITS = Limits(wall_s=240.0, cpu_s=240.0, memory_mb=1024, processes=256, output_bytes=1 << 20,
                disk_mb=256, address_space=False)


def limits_for(episode_timeout_s: float) -> Limits:
    """One opencode run is one sandbox call: its wall clock (and CPU) is the episode's, less a
    margin, so that a harness that hangs (or retries a refused request forever) is stopped and
    reported with its stderr rather than cut off by the episode timeout."""
    wall = episode_timeout_s - min(15.0, episode_timeout_s / 4)
    return dataclasses.replace(LIMITS, wall_s=wall, cpu_s=wall)


def opencode_binary() -> Path:
    """opencode's native binary: $AJET_OPENCODE, or what `make harnesses` installed."""
    if named := os.environ.get("AJET_OPENCODE"):
        return Path(named)
    found = sorted((ROOT / ".harness" / "node_modules").glob("opencode-linux-*/bin/opencode"),
                   key=lambda path: "baseline" in str(path))  # the AVX2 build first
    if not found:
        raise HarnessFailed("opencode is not installed: run `make harnesses` (npm install opencode-ai "
                            "into .harness/), or set AJET_OPENCODE to its binary")
    return found[0]


def opencode_config(base_url: str, api_key: str, max_tokens: int) -> dict:
    """opencode's own config (opencode.json): ajet as an OpenAI-compatible provider."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"ajet": {
            "npm": "@ai-sdk/openai-compatible", "name": "ajet",
            "options": {"baseURL": base_url, "apiKey": api_key},
            "models": {"policy": {"name": "policy", "limit": {"context": 4096, "output": max_tokens}}},
        }},
        "model": "ajet/policy",
        "small_model": "ajet/policy",
        "autoupdate": False,
        # The sandbox is the isolation: opencode's own asking (which `opencode run` answers "no",
        # ending the run) is off.
        "permission": {"bash": "allow", "edit": "allow", "external_directory": "allow"},
        "share": "disabled",
        "tools": {name: False for name in ("glob", "grep", "skill", "task", "todowrite", "webfetch",
                                           "read", "write")},
        "agent": {"fix": {"mode": "primary", "prompt": AGENT_PROMPT, "tools": {"bash": True, "edit": True}},
                  "title": {"disable": True}},
    }


ENV = {"HOME": HOME_AT, "OPENCODE_CONFIG": f"{HOME_AT}/opencode.json", "OPENCODE_DISABLE_AUTOUPDATE": "1",
       "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "NO_COLOR": "1",
       "TERM": "dumb"}


class OpencodeAgent(Workflow):
    name: str = "opencode_agent"
    max_tokens: int = 128  # opencode's output limit for the model (its `limit.output`)

    # A plain `def`: ajet runs it in a worker thread (the harness is one blocking sandbox call).
    def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        binary = opencode_binary()
        base_url, api_key = tuner.base_url_and_key()
        with ModelBridge(base_url) as bridge, \
                Sandbox(limits_for(tuner.session.rollout.episode_timeout_s), ro_paths=[str(binary.parent), *bridge.ro_paths]) as box:
            config = opencode_config(bridge.inside_url, api_key, self.max_tokens)
            box.write_files(repo_files(task.metadata["files"], {"home/opencode.json": json.dumps(config)}))
            run = box.run(bridge.shell([str(binary), "run", "--agent", "fix", task.main_query],
                                       env=ENV, cwd=REPO_AT, python=box.python))
            if run.exit_code != 0 or bridge.connections == 0:
                why = (f"exited with {run.status} (code {run.exit_code}{', ' + run.detail if run.detail else ''})"
                       if run.exit_code != 0 else "never called the model")
                raise HarnessFailed(f"opencode {why}; its last stderr lines: {stderr_tail(run.stderr)}")
            graded = grade(box, task.metadata, shared_pool())
        metrics = {"harness/wall_s": run.wall_s, "harness/connections": float(bridge.connections), **graded.metrics()}
        return WorkflowOutput(reward=graded.reward, is_success=graded.reward == 1.0, log_metrics=metrics,
                              metadata={"opencode_output": run.stdout[-2000:], "test_output": graded.text()})
