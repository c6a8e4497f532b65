"""A verifiers (0.4) environment behind ajet's env-service protocol (`ajet.env_protocol`).

verifiers pins packages that clash with ajet's (`mcp==2.0`, `openai<3`), so its environments run
in their own virtual environment (`make env-verifiers` builds `.venv-verifiers`), and this server
runs there, by path, importing verifiers and no ajet module but the protocol's:

    .venv-verifiers/bin/python ajet/envs/verifiers_server.py --port 8791

ajet's launcher starts it for a run whose YAML says `env.type: verifiers` (docs/environments.md).
The model's turns never come here: ajet's adapter (`ajet.envs.verifiers`) calls the model through
its tuner, so every call is recorded token by token, and sends each reply here. This server holds
the environment's side:

    POST /list_tasks {env_type: taskset id, split, args, limit} -> {task_ids, tasks: [{index, messages}]}
    POST /create {env_type, task_id, args, index}  -> {instance_id, observation: {messages, tools}}
    POST /step   {instance_id, action: the model's assistant message (OpenAI form)}
                                                   -> {observation: {messages: tool results}, done}
    POST /evaluate {instance_id}                   -> {reward, rewards: {name: {score, weight}}, metrics}

The taskset (`env_type` is its id, `args` its config) gives the tasks: their prompt and system
prompt. A task's tools are its toolsets' `@vf.tool` methods (`Task.toolsets`, `Taskset.toolsets`),
run here in process. The rollout ends at a reply without tool calls. The score is the task's own:
`Task.score` over a trace built from the conversation, each `@vf.reward` function weighted
(`reward` the weighted sum) and each `@vf.metric` recorded. With AJET_ENV_TOKEN set, every route
but /health needs `Authorization: Bearer <token>`, checked before a body is read.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hmac
import inspect
import itertools
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

# Run by path, in verifiers' environment: ajet's root takes the place of this file's folder on the
# path (where `import verifiers` would find ajet's adapter, ajet/envs/verifiers.py), for the protocol.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import uvicorn  # noqa: E402 - after the path
from pydantic import TypeAdapter, create_model  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from ajet.env_protocol import CREATE, EVALUATE, HEALTH, LIST_TASKS, RELEASE, STEP, TOKEN_ENV  # noqa: E402

logger = logging.getLogger("ajet.envs.verifiers_server")
MAX_BODY = 4 << 20  # a conversation's reply or a task's args


class Refused(Exception):
    """A request this server refuses: answered with `status` and the message as the detail."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _vf() -> Any:
    # The environment's own package: only in this server's environment (ajet's has it not: no stubs).
    import verifiers.v1 as vf  # type: ignore[import-not-found]

    return vf


@functools.lru_cache(maxsize=16)
def _taskset(taskset_id: str, args_json: str) -> tuple[Any, Any]:
    """The taskset's config and class (`env_type` is its id, `args` its config)."""
    vf = _vf()
    try:
        config = vf.taskset_config_type(taskset_id).model_validate({**json.loads(args_json), "id": taskset_id})
    except ModuleNotFoundError as exc:
        raise Refused(404, f"verifiers taskset {taskset_id!r} is not installed in {sys.prefix}: {exc}") from None
    except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise Refused(400, f"verifiers taskset {taskset_id} with args {args_json}: {exc}") from None
    return config, type(vf.load_taskset(config))


@functools.lru_cache(maxsize=16)
def _tasks(taskset_id: str, args_json: str, limit: int) -> list[Any]:
    """The taskset's first `limit` tasks (its order), built once per (id, config, limit)."""
    config, cls = _taskset(taskset_id, args_json)
    return list(cls(config).take(limit))


def _messages(task: Any) -> list[dict[str, Any]]:
    data = task.data
    out: list[dict[str, Any]] = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        out += [m.model_dump(exclude_none=True) for m in data.prompt or []]
    return out


def _tools(task: Any, taskset_config: Any, taskset_cls: Any) -> dict[str, Any]:
    """The task's tools by name: each toolset's `@vf.tool` methods, bound."""
    from verifiers.v1.utils.decorators import discover_decorated  # type: ignore[import-not-found]

    tools: dict[str, Any] = {}
    for toolset in [*type(task).toolsets(task.config), *taskset_cls.toolsets(taskset_config)]:
        for fn in discover_decorated(toolset, "tool"):
            name = getattr(fn, "tool_name", None) or fn.__name__
            if name in tools:
                raise Refused(400, f"two tools are named {name!r}: rename one (ajet calls tools by name)")
            tools[name] = fn
    return tools


def _tool_spec(name: str, fn: Any) -> dict[str, Any]:
    """The OpenAI function spec of a tool: its parameters' JSON schema from its signature."""
    fields = {p.name: (p.annotation if p.annotation is not inspect.Parameter.empty else Any,
                       ... if p.default is inspect.Parameter.empty else p.default)
              for p in inspect.signature(fn).parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    schema = create_model(f"{name}_args", **fields).model_json_schema()  # type: ignore[call-overload]
    schema.pop("title", None)
    return {"type": "function", "function": {"name": name, "description": (fn.__doc__ or "").strip(),
                                             "parameters": schema}}


class Rollout:
    """One episode: the task, its tools, and the conversation so far."""

    def __init__(self, task: Any, tools: dict[str, Any]) -> None:
        self.task = task
        self.tools = tools
        self.messages = _messages(task)

    async def step(self, message: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        """The model's reply in; the tool results out (none: the rollout is done)."""
        self.messages.append(message)
        calls = message.get("tool_calls") or []
        results = [{"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                    "content": await self._call(call["function"]["name"], call["function"]["arguments"])}
                   for call in calls]
        self.messages += results
        return results, not calls

    async def _call(self, name: str, arguments: str) -> str:
        # A tool's failure is the model's to read (as in verifiers' own harnesses), not the episode's.
        if name not in self.tools:
            return f"Error: no tool named {name!r}; the tools are {', '.join(sorted(self.tools))}"
        try:
            args = json.loads(arguments or "{}")
            result = self.tools[name](**args)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # noqa: BLE001 - the tool's code: its error goes back to the model
            return f"Error: {type(exc).__name__}: {exc}"
        return result if isinstance(result, str) else json.dumps(result)

    async def score(self) -> dict[str, Any]:
        """`Task.score` over the conversation as a verifiers trace."""
        vf = _vf()
        from verifiers.v1.configs.agent import AgentConfig  # type: ignore[import-not-found]
        from verifiers.v1.graph import MessageNode  # type: ignore[import-not-found]
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask  # type: ignore[import-not-found]

        messages = TypeAdapter(vf.Messages).validate_python(
            [{**m, "tool_calls": [{"id": c["id"], "name": c["function"]["name"],
                                   "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]}
             if m.get("tool_calls") else m for m in self.messages])
        prompt_len = len(_messages(self.task))
        nodes = [MessageNode(parent=i - 1 if i else None, message=m, sampled=i >= prompt_len and m.role == "assistant")
                 for i, m in enumerate(messages)]
        task = self.task
        trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                      agent=AgentInfo(config=AgentConfig()), nodes=nodes)
        await task.score(trace)
        missing = [name for name, reward in trace.rewards.items() if reward is None]
        if missing:
            raise Refused(500, f"the task's rewards {missing} did not score (they need a runtime: a sandbox)")
        return {"reward": trace.reward,
                "rewards": {name: r.model_dump() for name, r in trace.rewards.items() if r is not None},
                "metrics": {name: v for name, v in trace.metrics.items() if v is not None}}


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object, within MAX_BODY bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise Refused(413, f"the body is over {MAX_BODY} bytes")
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise Refused(413, f"the body is over {MAX_BODY} bytes")
    try:
        parsed = json.loads(raw or b"{}")
    except ValueError as exc:
        raise Refused(400, f"the body is no JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise Refused(400, "the body must be a JSON object")
    return parsed


def _tasks_of(req: dict[str, Any]) -> list[Any]:
    return _tasks(str(req.get("env_type", "")), json.dumps(req.get("args") or {}, sort_keys=True),
                  int(req.get("limit", 1 << 30)))


class _Instances:
    """The live rollouts, by instance id: the env-service protocol's handlers."""

    def __init__(self) -> None:
        self.instances: dict[str, Rollout] = {}
        self.lock = threading.Lock()
        self.counter = itertools.count()

    def rollout(self, req: dict[str, Any]) -> Rollout:
        with self.lock:
            if req.get("instance_id") not in self.instances:
                raise Refused(404, f"unknown instance_id {req.get('instance_id')!r} (released, or never created)")
            return self.instances[req["instance_id"]]

    async def list_tasks(self, req: dict[str, Any]) -> dict[str, Any]:
        tasks = _tasks_of(req)
        return {"task_ids": [str(t.data.idx) for t in tasks],
                "tasks": [{"index": t.data.idx, "messages": _messages(t)} for t in tasks]}

    async def create(self, req: dict[str, Any]) -> dict[str, Any]:
        index = int(req.get("index", -1))
        tasks = _tasks_of(req)
        if not 0 <= index < len(tasks):
            raise Refused(404, f"taskset {req.get('env_type')} has no task {index} ({len(tasks)} tasks)")
        task = tasks[index]
        tools = _tools(task, *_taskset(str(req["env_type"]), json.dumps(req.get("args") or {}, sort_keys=True)))
        with self.lock:
            instance_id = f"vf-{next(self.counter)}"
            self.instances[instance_id] = Rollout(task, tools)
        return {"instance_id": instance_id, "info": {},
                "observation": {"messages": self.instances[instance_id].messages,
                                "tools": [_tool_spec(name, fn) for name, fn in tools.items()]}}

    async def step(self, req: dict[str, Any]) -> dict[str, Any]:
        action = req.get("action")
        if not isinstance(action, dict) or action.get("role") != "assistant":
            raise Refused(400, "the action must be the model's reply: an assistant message")
        results, done = await self.rollout(req).step(action)
        return {"observation": {"messages": results}, "reward": 0.0, "done": done, "info": {}}

    async def evaluate(self, req: dict[str, Any]) -> dict[str, Any]:
        return await self.rollout(req).score()

    async def release(self, req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            return {"released": self.instances.pop(str(req.get("instance_id")), None) is not None}


def _endpoint(handler: Any, token: str) -> Any:
    """`handler(body)` behind the bearer token, its refusals and errors as JSON answers."""
    async def run(request: Request) -> JSONResponse:
        given = request.headers.get("authorization", "")
        if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return JSONResponse({"detail": "a bearer token is needed (AJET_ENV_TOKEN)"}, status_code=401)
        try:
            return JSONResponse(await handler(await _body(request)))
        except Refused as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        except Exception as exc:  # noqa: BLE001 - the environment's code: its error goes to the client
            logger.exception("%s failed", request.url.path)
            return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=500)
    return run


async def _health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok", "env_types": [], "verifiers": _version()})


def create_app(token: str = "") -> Starlette:
    live = _Instances()
    routes = {LIST_TASKS: live.list_tasks, CREATE: live.create, STEP: live.step, EVALUATE: live.evaluate,
              RELEASE: live.release}
    return Starlette(routes=[Route(HEALTH, _health, methods=["GET"]),
                             *(Route(path, _endpoint(h, token), methods=["POST"]) for path, h in routes.items())])


def _version() -> str:
    from importlib.metadata import version

    return version("verifiers")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a verifiers environment behind ajet's env-service protocol")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if not token and args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error(f"--host {args.host} without a token: set {TOKEN_ENV}")
    logging.basicConfig(level=logging.INFO)
    _vf()  # fail now, with the import's error, if verifiers is not in this environment
    asyncio.run(uvicorn.Server(uvicorn.Config(create_app(token), host=args.host, port=args.port,
                                              log_level="warning")).serve())


if __name__ == "__main__":
    main()
