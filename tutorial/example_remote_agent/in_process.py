"""agent.py's own `solve`, run in-process: how `ajet eval` scores the remote agent on a split.

    ajet eval --conf tutorial/example_remote_agent/remote_agent.yaml --split test \
        workflow.target=tutorial/example_remote_agent/in_process.py:RemoteAgentInProcess

`ajet serve` trains on episodes that clients run; evaluating a checkpoint needs episodes too,
and `ajet eval` runs a workflow. This one hands agent.py's unchanged `solve` (the OpenAI SDK,
the same prompt, no sampling arguments) an episode whose `base_url` and `api_key` are the
evaluation's gateway (`tuner.base_url_and_key()`), and gives its reply to the math judge as
the final answer, as the clients' `finish` does. So the evaluated agent is the trained one:
only the episode's begin/finish calls differ, and those carry no model call.
"""

from __future__ import annotations

import asyncio
import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from ajet import Workflow, WorkflowOutput, WorkflowTask

_SPEC = importlib.util.spec_from_file_location("ajet_remote_agent_client", Path(__file__).with_name("agent.py"))
assert _SPEC is not None and _SPEC.loader is not None
agent = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(agent)
# One thread a running episode (asyncio's default pool has cpu_count + 4 threads, which would
# cap the evaluation's concurrency, and so its batches, far below rollout.max_concurrency).
_THREADS = ThreadPoolExecutor(max_workers=128, thread_name_prefix="remote-agent")


class RemoteAgentInProcess(Workflow):
    name: str = "remote_agent_in_process"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        base_url, api_key = tuner.base_url_and_key()
        episode = SimpleNamespace(
            episode_id=task.task_id, base_url=base_url, api_key=api_key, model="ajet",
            task={"task_id": task.task_id, "main_query": task.main_query, "metadata": task.metadata})
        # agent.py's client is synchronous: a thread, so the gateway (this event loop) can answer it
        answer = await asyncio.get_running_loop().run_in_executor(_THREADS, agent.solve, episode)
        return WorkflowOutput(reward=None, metadata={"final_answer": answer})
