"""The sandbox as an env service, so that model-written code runs on other machines.

    AJET_SANDBOX_TOKEN=... python -m ajet.sandbox.service --host 10.0.0.7 --port 8790 --pool-size 8

It speaks ajet's env-service protocol (ajet/task_reader/env_server.py):
    POST /create  {env_type: "sandbox", task_id}   -> {instance_id, observation: "", info: {limits}}
    POST /step    {instance_id, action}            -> {observation: tool text, reward: 0, done: false,
                                                       info: the RunResult}
        action: {"code": "..."} | {"command": "..."} | {"files": {path: base64}} | {"read": path}
    POST /release {instance_id}                    -> {released}
    GET  /health, POST /list_tasks ([]), POST /evaluate ({reward: 0})
A sandbox lives from /create to /release (one episode). Instance ids are random (unguessable);
every route but /health needs `Authorization: Bearer <token>` when a token is set, and a token
is required to listen beyond loopback. Bodies are capped before they are read (BodyGuard).

`RemoteSandbox` is the client: the same calls as a local `Sandbox`, so a `SandboxSession`
drives either (`sandbox.backend: service`).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import logging
import os
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from ajet import http_server
from ajet.errors import SandboxUnavailableError
from ajet.net import is_loopback
from ajet.sandbox.box import Limits, RunResult, SandboxCrashed, SandboxRequestError
from ajet.sandbox.pool import SandboxPool
from ajet.tuner.http_guard import BodyGuard

log = logging.getLogger(__name__)
ENV_TYPE = "sandbox"
MAX_BODY = 8 << 20  # files written in one step: 8 MiB


class CreateRequest(BaseModel):
    env_type: str = ENV_TYPE
    task_id: str = ""


class StepRequest(BaseModel):
    instance_id: str
    action: dict[str, Any]


class InstanceRequest(BaseModel):
    instance_id: str


def create_app(pool: SandboxPool, token: str = "") -> FastAPI:
    """The service over `pool` (its sandboxes, its limits)."""
    sessions: dict[str, Any] = {}
    lock = threading.Lock()

    app = FastAPI(title="ajet sandbox service", docs_url=None, redoc_url=None, openapi_url=None)
    # the token before a byte of the body is read, and every body capped
    app.add_middleware(BodyGuard, max_body_bytes=MAX_BODY,
                       client_token=lambda path: None if path == "/health" or not token else token)


    def session_of(instance_id: str) -> Any:
        with lock:
            if instance_id not in sessions:
                raise HTTPException(404, f"unknown instance_id '{instance_id}' (released, or never created)")
            return sessions[instance_id]

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "env_types": [ENV_TYPE]}

    @app.post("/list_tasks")
    def list_tasks() -> dict:
        return {"task_ids": []}

    @app.post("/create")
    def create(req: CreateRequest) -> dict:
        if req.env_type != ENV_TYPE:
            raise HTTPException(404, f"unknown env_type '{req.env_type}'; this server offers ['{ENV_TYPE}']")
        try:
            box = pool.acquire()
        except SandboxUnavailableError as exc:
            raise HTTPException(503, str(exc)) from None
        instance_id = secrets.token_hex(16)
        with lock:
            sessions[instance_id] = box
        return {"instance_id": instance_id, "observation": "", "info": {"limits": dataclasses.asdict(pool.limits)}}

    @app.post("/step")
    def step(req: StepRequest) -> dict:
        try:
            return act(req)
        except (SandboxCrashed, SandboxRequestError) as exc:  # a dead sandbox, a path outside it
            raise HTTPException(409, str(exc)) from None

    def act(req: StepRequest) -> dict:
        box = session_of(req.instance_id)
        action = req.action
        if "files" in action:
            box.write_files({p: base64.b64decode(d) for p, d in dict(action["files"]).items()})
            return {"observation": f"wrote {len(action['files'])} file(s)", "reward": 0.0, "done": False, "info": {}}
        if "read" in action:
            data = box.read_file(str(action["read"]), int(action.get("max_bytes", 1 << 20)))
            return {"observation": "", "reward": 0.0, "done": False,
                    "info": {"data": base64.b64encode(data).decode()}}
        if "code" in action:
            result = box.run_python(str(action["code"]), stdin=str(action.get("stdin", "")))
        elif "command" in action:
            command = action["command"]
            result = box.run(command if isinstance(command, str) else [str(a) for a in command],
                             stdin=str(action.get("stdin", "")))
        else:
            raise HTTPException(422, "action needs one of 'code', 'command', 'files', 'read'")
        if not box.alive:  # the code killed its sandbox: the next step gets a fresh one
            with lock:
                sessions[req.instance_id] = pool.acquire()
        return {"observation": result.as_tool_text(), "reward": 0.0, "done": False, "info": result.to_dict()}

    @app.post("/evaluate")
    def evaluate(req: InstanceRequest) -> dict:
        session_of(req.instance_id)
        return {"reward": 0.0, "is_success": False}

    @app.post("/release")
    def release(req: InstanceRequest) -> dict:
        with lock:
            box = sessions.pop(req.instance_id, None)
        if box is not None:
            pool.release(box)
        return {"released": box is not None}

    return app


class RemoteSandbox:
    """A sandbox on a sandbox service: the calls of `Sandbox`, over HTTP."""

    def __init__(self, base_url: str, token: str = "", *, timeout_s: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.instance_id = ""
        self.base_url = base_url

    def start(self) -> RemoteSandbox:
        self.instance_id = self._post("/create", {"env_type": ENV_TYPE, "task_id": ""})["instance_id"]
        return self

    @property
    def alive(self) -> bool:
        return bool(self.instance_id)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise SandboxUnavailableError(f"the sandbox service at {self.base_url} is unreachable: {exc}") from exc
        if response.status_code != 200:
            raise SandboxUnavailableError(
                f"the sandbox service at {self.base_url}{path} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def _step(self, action: dict[str, Any]) -> dict[str, Any]:
        return self._post("/step", {"instance_id": self.instance_id, "action": action})

    def run_python(self, code: str, *, stdin: str = "") -> RunResult:
        return RunResult(**self._step({"code": code, "stdin": stdin})["info"])

    def run(self, command: str | Sequence[str], *, stdin: str = "") -> RunResult:
        return RunResult(**self._step({"command": command if isinstance(command, str) else list(command),
                                       "stdin": stdin})["info"])

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self._step({"files": {p: base64.b64encode(d.encode() if isinstance(d, str) else d).decode()
                              for p, d in files.items()}})

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        return base64.b64decode(self._step({"read": path, "max_bytes": max_bytes})["info"]["data"])

    def close(self) -> None:
        if self.instance_id:
            try:
                self.client.post("/release", json={"instance_id": self.instance_id})
            except httpx.HTTPError:
                pass
            self.instance_id = ""
        self.client.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ajet's sandbox for model-written code, as an env service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--pool-size", type=int, default=4)
    for field in dataclasses.fields(Limits):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    token = os.environ.get("AJET_SANDBOX_TOKEN", "")
    if not token and not is_loopback(args.host):
        parser.error(f"--host {args.host} without a token: anyone who reaches the port could run code; "
                     "set AJET_SANDBOX_TOKEN (clients send it as sandbox.service_token)")
    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    with SandboxPool(size=args.pool_size, limits=limits) as pool:
        # header and idle deadlines, connection caps (docs/sandbox.md)
        http_server.serve(create_app(pool, token), args.host, args.port)


if __name__ == "__main__":
    main()
