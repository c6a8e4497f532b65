"""OpenEnv (https://github.com/meta-pytorch/OpenEnv, openenv-core 0.3): an environment server,
driven through OpenEnv's own client protocol, one session per episode.

The server is either started by the launcher from its Python package (`env.openenv.app`, the
package's ASGI app, under uvicorn on 127.0.0.1: openenv-core's pins clash with ajet's, so it runs
in `.venv-openenv`, `make env-openenv`), or joined by URL (`env.openenv.url`). If a server the
launcher started dies, the episodes in flight fail (counted), the launcher starts it again, and
the run goes on.

The protocol is OpenEnv's WebSocket one (`/ws`; openenv.core.env_client): each connection is a
session with an environment of its own on the server, so concurrent episodes never share one.
An episode: `reset` (with the task's seed and `env.args`), then one model call per `step`, up to
`env.max_turns` or `done`. The model reads the observation (its `env.openenv.observation_field`,
or the whole of it as JSON) and its reply is the action: the text of the action's one string
field (`env.openenv.action_field`, or the one the action schema has), else a JSON object of the
action (a reply that holds none, or that the environment's schema refuses, is an invalid move:
counted, nothing happens, the turn is spent).

The reward is the sum of the steps' rewards; each call's reward is its step's (`step_rewards`).
An environment that fails (an execution error, the server gone) or answers a malformed
observation or reward fails the episode (`EnvError`), never the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from ajet.config.schema import EnvConfig
from ajet.envs.base import EnvError, Split, reply_text
from ajet.envs.service import local_url
from ajet.errors import TaskReaderError
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

START_HINT = ("Set env.openenv.app (the environment package's ASGI app, 'package.module:app', installed in "
              ".venv-openenv: make env-openenv) and run with `ajet train`, whose launcher starts it; or start "
              "the server yourself and set env.openenv.url")
_JSON_OBJECT = re.compile(r"\{.*\}", re.S)


class OpenEnvTask(BaseModel):
    """`task.metadata["env"]`: the server, the reset's arguments, and how replies become actions."""

    model_config = ConfigDict(extra="forbid")

    url: str
    id: str
    args: dict[str, Any]
    seed: int
    max_turns: int
    action_field: str
    action_schema: dict[str, Any]
    observation_field: str
    system_prompt: str
    timeout_s: float


def server_url(cfg: EnvConfig) -> str:
    return cfg.openenv.url.rstrip("/") or local_url(cfg.openenv.port)


def action_field(schema: dict[str, Any], configured: str) -> str:
    """The field a reply's text fills: the configured one, else the schema's only string field
    ("" when it has none or several: the reply is then the action as JSON)."""
    fields = {name: prop for name, prop in (schema.get("properties") or {}).items() if name != "metadata"}
    if configured:
        if configured not in fields:
            raise TaskReaderError(f"env.openenv.action_field={configured!r}: the action has the fields "
                                  f"{', '.join(fields) or 'none'}")
        return configured
    strings = [name for name, prop in fields.items() if prop.get("type") == "string"]
    return strings[0] if len(strings) == 1 and len(fields) == 1 else ""


def default_prompt(env_id: str, field: str, schema: dict[str, Any]) -> str:
    if field:
        return (f"You act in the environment {env_id}. Each turn you see its observation; your reply is your "
                "action.")
    fields = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    return (f"You act in the environment {env_id}. Each turn you see its observation and answer with your action "
            f"as one JSON object with the fields {json.dumps(fields)}.")


def make_tasks(cfg: EnvConfig, splits: list[Split]) -> list[list[WorkflowTask]]:
    """Each split's resets as tasks: the k-th resets with the split's seed + k."""
    url = server_url(cfg)
    try:
        response = httpx.get(f"{url}/schema", timeout=cfg.openenv.timeout_s)
        response.raise_for_status()
        schema = response.json().get("action") or {}
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise TaskReaderError(f"cannot read the OpenEnv server's action schema at {url}/schema: "
                              f"{type(exc).__name__}: {exc}. {START_HINT}") from None
    field = action_field(schema, cfg.openenv.action_field)
    prompt = cfg.openenv.system_prompt or default_prompt(cfg.id, field, schema)
    out: list[list[WorkflowTask]] = []
    for split in splits:
        tasks = []
        for k in range(split.size):
            spec = OpenEnvTask(url=url, id=cfg.id, args=cfg.args, seed=split.seed + k, max_turns=cfg.max_turns,
                               action_field=field, action_schema=schema,
                               observation_field=cfg.openenv.observation_field, system_prompt=prompt,
                               timeout_s=cfg.openenv.timeout_s)
            tasks.append(WorkflowTask(task_id=f"{cfg.id}-{split.name}-{k}",
                                      main_query=f"{cfg.id}, reset(seed={spec.seed})",
                                      metadata={"env": spec.model_dump()}, env_type="openenv"))
        out.append(tasks)
    return out


class Session:
    """One OpenEnv session: a WebSocket to `/ws` (aiohttp's client, which ajet's environment has),
    one request and one answer at a time."""

    def __init__(self, spec: OpenEnvTask) -> None:
        self.spec = spec
        self._http: Any = None
        self._ws: Any = None

    async def __aenter__(self) -> Session:
        import aiohttp  # only where an OpenEnv env is used

        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.spec.timeout_s))
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._ws is not None and not self._ws.closed:
                await self._ws.send_str(json.dumps({"type": "close", "data": {}}))
                await self._ws.close()
        except (OSError, RuntimeError):
            pass  # the server is gone already: nothing left to close there
        finally:
            await self._http.close()

    async def request(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        where = f"{self.spec.url}/ws"
        try:
            if self._ws is None:
                self._ws = await self._http.ws_connect(where.replace("http", "ws", 1), max_msg_size=100 << 20)
            await self._ws.send_str(json.dumps({"type": kind, "data": data}))
            message = await self._ws.receive(timeout=self.spec.timeout_s)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise EnvError(f"the OpenEnv server at {where} failed on {kind}: {type(exc).__name__}: {exc}") from exc
        if message.type != aiohttp.WSMsgType.TEXT:
            raise EnvError(f"the OpenEnv server at {where} closed the session on {kind} ({message.type.name})")
        try:
            answer = json.loads(message.data)
        except ValueError:
            raise EnvError(f"the OpenEnv server answered {kind} with no JSON: {message.data[:200]!r}") from None
        if not isinstance(answer, dict):
            raise EnvError(f"the OpenEnv server answered {kind} with {type(answer).__name__}, not an object")
        return answer

    async def reset(self) -> dict[str, Any]:
        """`reset`, waiting (up to the timeout) while the server is at its session limit."""
        deadline = time.monotonic() + self.spec.timeout_s
        while True:
            answer = await self.request("reset", {**self.spec.args, "seed": self.spec.seed})
            error = answer.get("data", {}) if answer.get("type") == "error" else {}
            if error.get("code") != "CAPACITY_REACHED" or time.monotonic() > deadline:
                return _observation(answer, "reset")
            await self._ws.close()
            self._ws = None
            await asyncio.sleep(0.2)


def _observation(answer: dict[str, Any], what: str) -> dict[str, Any]:
    """{observation, reward, done} of an answer, checked; an error answer is the episode's."""
    data = answer.get("data")
    if answer.get("type") == "error":
        raise EnvError(f"the OpenEnv environment failed on {what}: {json.dumps(data)[:2000]}")
    if answer.get("type") != "observation" or not isinstance(data, dict):
        raise EnvError(f"the OpenEnv server answered {what} with {json.dumps(answer)[:300]}: no observation")
    observation, reward, done = data.get("observation"), data.get("reward"), data.get("done")
    if not isinstance(observation, dict):
        raise EnvError(f"the OpenEnv environment's {what} returned the observation {observation!r:.200}: not an object")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)
                               or not math.isfinite(reward)):
        raise EnvError(f"the OpenEnv environment's {what} returned the reward {reward!r}: not a finite number")
    if not isinstance(done, bool):
        raise EnvError(f"the OpenEnv environment's {what} returned done={done!r}: not a bool")
    return data


def observation_text(data: dict[str, Any], field: str) -> str:
    observation = data["observation"]
    if field:
        if field not in observation:
            raise EnvError(f"the observation has no field {field!r} (env.openenv.observation_field); it has "
                           f"{', '.join(observation)}")
        value = observation[field]
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(observation)


def parse_action(reply: str, field: str) -> dict[str, Any] | None:
    """The action a reply gives: its text in `field`, or the JSON object it holds (None: none)."""
    if field:
        return {field: reply}
    found = _JSON_OBJECT.search(reply)
    if found is None:
        return None
    try:
        action = json.loads(found.group(0))
    except ValueError:
        return None
    return action if isinstance(action, dict) else None


class EnvWorkflow(Workflow):
    """The episode loop: observe, ask the model, act; up to max_turns calls or done."""

    name: str = "openenv"

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        spec = OpenEnvTask.model_validate(task.metadata["env"])
        async with Session(spec) as session:
            data = await session.reset()
            messages: list[dict[str, Any]] = [{"role": "system", "content": spec.system_prompt}]
            rewards: list[float] = []
            note, invalid, done = "", 0, bool(data["done"])
            while not done and len(rewards) < spec.max_turns:
                messages.append({"role": "user", "content": note + observation_text(data, spec.observation_field)})
                reply = reply_text(await tuner(messages))
                # The reply goes back exactly as received, so the next call extends this one (one sample).
                messages.append({"role": "assistant", "content": reply})
                action = parse_action(reply, spec.action_field)
                answer = None if action is None else await session.request("step", action)
                if answer is None or _refused(answer):
                    invalid += 1
                    rewards.append(0.0)
                    note = ("No action found in your reply" if answer is None else
                            f"The environment refused the action: {json.dumps(answer.get('data'))[:300]}") + "\n"
                    continue
                data = _observation(answer, "step")
                rewards.append(float(data["reward"] or 0.0))
                done, note = bool(data["done"]), ""
        total = sum(rewards)
        return WorkflowOutput(
            reward=total,
            is_success=done and total > 0,
            step_rewards=rewards,
            metadata={"last_observation": data["observation"]},
            log_metrics={"turns": float(len(rewards)), "invalid_moves": float(invalid), "return": total,
                         "done": float(done)},
        )


def _refused(answer: dict[str, Any]) -> bool:
    """An action the environment's schema refused: the model's invalid move, not a failure."""
    return answer.get("type") == "error" and (answer.get("data") or {}).get("code") == "VALIDATION_ERROR"
