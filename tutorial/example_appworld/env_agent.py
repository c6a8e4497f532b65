"""An agent that drives an environment service (the env-service HTTP protocol).

The `env_service` task reader lists the service's tasks; for each episode this workflow
creates an instance, shows the model each observation, sends the model's reply back as
the action, and ends when the environment says `done` (or after MAX_TURNS replies). The
reward is the environment's own evaluation. The instance is always released.

Shipped with ajet: the reference server (`python -m ajet.task_reader.env_server`, key-value
store tasks). Any server speaking the same protocol (an AppWorld adapter, see README.md)
works unchanged: only `task_reader.env_service.base_url` / `env_type` change.

Where the environment names its state (`info["state"]`: the reference server's is a key of the
store's contents), each call is marked with the state it acts in (`step_states`), so that step
credit (`algorithm.step_credit: gigpo`, appworld_step_credit.yaml) compares the steps of one
task's rollouts taken from the same store. An environment without it leaves them unmarked.
"""

from __future__ import annotations

from ajet import Workflow, WorkflowOutput, WorkflowTask
from ajet.task_reader.env_client import AsyncEnvServiceClient

MAX_TURNS = 8  # the agent's own budget; the environment may end the episode sooner
SYSTEM_PROMPT = (
    "You operate an application through its text interface. Read each observation and answer "
    "with exactly one action in the format the environment asks for. When the goal is reached, "
    "finish as the environment describes."
)


class EnvServiceAgent(Workflow):
    name: str = "env_agent"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        async with AsyncEnvServiceClient(task.metadata["env_base_url"]) as env:
            created = await env.create(task.env_type, task.task_id)
            instance = created["instance_id"]
            try:
                turns, done, errors, states = await self._play(env, instance, created, tuner)
                verdict = await env.evaluate(instance)
            finally:
                await env.release(instance)
        return WorkflowOutput(
            reward=float(verdict["reward"]),
            is_success=bool(verdict.get("is_success", False)),
            step_states=states if any(states) else None,  # the state each call acted in
            metadata={"instance_id": instance, "verdict": verdict},
            log_metrics={"turns": float(turns), "env_done": float(done), "action_errors": float(errors)},
        )

    async def _play(self, env: AsyncEnvServiceClient, instance: str, created: dict,
                    tuner) -> tuple[int, bool, int, list[str | None]]:  # noqa: ANN001
        """Observation -> model -> action, until done; returns (turns, done, action errors, the
        environment's state before each call)."""
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": created["observation"]}]
        turns, done, errors = 0, False, 0
        state, states = (created.get("info") or {}).get("state"), []
        while not done and turns < MAX_TURNS:
            states.append(state)
            response = await tuner(messages)
            action = "".join(block["text"] for block in response.content if block["type"] == "text")
            messages.append({"role": "assistant", "content": action})  # as received: calls extend
            result = await env.step(instance, action)
            turns += 1
            done = bool(result["done"])
            info = result.get("info") or {}
            errors += "error" in info
            state = info.get("state")
            if not done:
                messages.append({"role": "user", "content": str(result["observation"])})
        return turns, done, errors, states
