"""mini-swe-agent (PyPI `mini-swe-agent`, unmodified) fixes a tiny repository's bug; its shell
commands run in ajet's sandbox and its model calls go to ajet's gateway.

    ajet --conf tutorial/example_coding_agents/mini_swe_agent.yaml --backbone=debug

The agent is built as its own `mini` command builds it: its bundled `mini.yaml` config (system
and instance templates, the `bash` tool, the observation format), merged with
`harness_config/mini_swe_agent.yaml` beside this file (the model: litellm's OpenAI provider pointed at
the episode's gateway URL and key; the step limit). The one piece ajet supplies is its
environment class, `SandboxEnvironment`: mini-swe-agent's pluggable environment interface
(`execute`, `get_template_vars`, `serialize`), running each command in the episode's sandbox,
in /sandbox/repo. The reward is the task's original unit test, run on the agent's edited source
files in a fresh sandbox afterwards (coding.grade).
"""

from __future__ import annotations

import logging
import os
import platform
import shlex
from pathlib import Path
from typing import Any

import yaml

# The workflow's folder is on sys.path (ajet's workflow loader puts it there).
from coding import REPO_AT, HarnessFailed, grade, repo_files

from ajet import Workflow, WorkflowOutput, WorkflowTask
from ajet.sandbox import shared_pool

HERE = Path(__file__).parent
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandboxEnvironment:
    """mini-swe-agent's environment interface over one episode's sandbox session."""

    def __init__(self, box: Any, *, cwd: str = REPO_AT, env: dict[str, str] | None = None, **_: Any) -> None:
        self.box = box
        self.cwd = cwd
        self.env = dict(env or {})
        self.commands = 0
        self.failed_commands = 0

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        command = str(action.get("command", ""))
        exports = "".join(f"export {key}={shlex.quote(value)}; " for key, value in self.env.items())
        result = self.box.run(f"{exports}cd {cwd or self.cwd} && {command}")
        self.commands += 1
        self.failed_commands += 0 if result.ok else 1
        output = result.stdout + result.stderr
        if result.status not in ("ok", "error"):  # timeout, oom, refused, output_limit: say so
            output += f"\n[{result.status}: {result.detail}]"
        lines = output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and result.ok:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return {"output": output, "returncode": result.exit_code if result.exit_code is not None else -1,
                "exception_info": "" if result.status in ("ok", "error") else result.detail}

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {"cwd": self.cwd, "env": self.env} | platform.uname()._asdict() | kwargs

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": {"cwd": self.cwd, "env": self.env},
                                    "environment_type": f"{__name__}.SandboxEnvironment"}}}


def mini_config(base_url: str, api_key: str) -> dict:
    """mini-swe-agent's own `mini.yaml`, merged with this tutorial's settings and the episode's
    endpoint (as `mini -c mini.yaml -c harness_config/mini_swe_agent.yaml` would merge them)."""
    from minisweagent.config import builtin_config_dir
    from minisweagent.utils.serialize import recursive_merge

    ours = yaml.safe_load((HERE / "harness_config" / "mini_swe_agent.yaml").read_text())
    endpoint = {"model": {"model_kwargs": {"api_base": base_url, "api_key": api_key}}}
    return recursive_merge(yaml.safe_load((builtin_config_dir / "mini.yaml").read_text()), ours, endpoint)


def quiet_imports() -> None:
    """Import litellm and mini-swe-agent without a download and with their logs at WARNING."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no download at import
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    # One attempt per call: a retried request whose first attempt ran would be recorded twice,
    # and ajet retries failed episodes itself (mini-swe-agent's default: 10, waiting up to 60 s).
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    import litellm

    litellm.suppress_debug_info = True
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm_model", "agent", "minisweagent"):
        logging.getLogger(name).setLevel(logging.WARNING)


class MiniSweAgent(Workflow):
    name: str = "mini_swe_agent"

    # A plain `def`: ajet runs it in a worker thread, since mini-swe-agent is synchronous
    # (litellm's blocking client, subprocess-style commands) and its first import takes seconds.
    def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        quiet_imports()
        from minisweagent.agents import get_agent
        from minisweagent.models import get_model

        base_url, api_key = tuner.base_url_and_key()
        config = mini_config(base_url, api_key)
        with shared_pool().session_sync(repo_files(task.metadata["files"])) as box:
            env = SandboxEnvironment(box, **config.get("environment", {}))
            model = get_model(config=config["model"])
            agent = get_agent(model, env, config["agent"], default_type="default")
            try:
                info = agent.run(task.main_query)
            except Exception as exc:
                raise HarnessFailed(f"mini-swe-agent stopped with {type(exc).__name__}: {exc}") from exc
            if agent.n_calls == 0:
                raise HarnessFailed(f"mini-swe-agent never called the model (exit: {info.get('exit_status')})")
            graded = grade(box, task.metadata, shared_pool())
            metrics = box.metrics() | graded.metrics()
        metrics |= {
            "harness/turns": float(agent.n_calls),
            "harness/commands": float(env.commands),
            # the share of turns whose reply held a bash call that parsed (mini-swe-agent's own check)
            "harness/valid_command_rate": min(1.0, env.commands / agent.n_calls),
            "harness/failed_command_rate": env.failed_commands / env.commands if env.commands else 0.0,
            "harness/submitted": 1.0 if info.get("exit_status") == "Submitted" else 0.0,
        }
        return WorkflowOutput(reward=graded.reward, is_success=graded.reward == 1.0, log_metrics=metrics,
                              metadata={"exit_status": info.get("exit_status", ""), "test_output": graded.text()})
