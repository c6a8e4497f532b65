"""The sandbox as an env service, so that model-written code runs on other machines.

    AJET_SANDBOX_TOKEN=... python -m ajet.sandbox.service --host 10.0.0.7 --port 8790 --pool-size 8

It speaks ajet's env-service protocol (`ajet.env_protocol`):
    POST /create  {env_type: "sandbox", task_id}   -> {instance_id, observation: "", info: {limits}}
    POST /step    {instance_id, action}            -> {observation: tool text, reward: 0, done: false,
                                                       info: the RunResult}
        action: {"code": "..."} | {"command": "..."} | {"files": {path: base64}} | {"read": path}
    POST /release {instance_id}                    -> {released}
    GET  /health, POST /list_tasks ([]), POST /evaluate ({reward: 0})
A sandbox lives from /create to /release (one episode), or until it has gone `--idle-ttl-s`
without a call (a client that died without /release does not hold it forever); at most
`--max-sessions` live at once (/create answers 503 past that). Instance ids are random (unguessable);
every route but /health needs `Authorization: Bearer <token>` when a token is set, and a token
is required to listen beyond loopback. Bodies are capped before they are read (BodyGuard).

`RemoteSandbox` is the client: the same calls as a local `Sandbox`, so a `SandboxSession`
drives either (`sandbox.backend: service`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException

from ajet import http_server
from ajet.env_protocol import (
    CREATE,
    EVALUATE,
    HEALTH,
    LIST_TASKS,
    RELEASE,
    STEP,
    CreateRequest,
    InstanceRequest,
    StepRequest,
)
from ajet.errors import SandboxUnavailableError
from ajet.net import is_loopback
from ajet.sandbox.box import Limits, RunResult, SandboxCrashed, SandboxRequestError
from ajet.sandbox.pool import SandboxPool
from ajet.tuner.http_guard import BodyGuard

log = logging.getLogger(__name__)
ENV_TYPE = "sandbox"
MAX_BODY = 8 << 20  # files written in one step: 8 MiB
MAX_SESSIONS = 64  # live sandboxes at once (each: bubblewrap, an interpreter, its tmpfs)
IDLE_TTL_S = 600.0  # a session without a call for this long is released


class SandboxCreateRequest(CreateRequest):
    env_type: str = ENV_TYPE  # this server has one environment: a client may leave it out


@dataclasses.dataclass
class _Held:
    box: Any
    last_used: float
    busy: int = 0  # steps running on it now: never released for idleness while > 0


class SessionTable:
    """The service's live sessions: at most `max_sessions` at once, and each released once it
    has gone `idle_ttl_s` without a call (by a background thread, so an idle service frees
    them too). A client that died without /release thus holds a sandbox for `idle_ttl_s`."""

    def __init__(self, pool: SandboxPool, max_sessions: int = MAX_SESSIONS, idle_ttl_s: float = IDLE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 1 or idle_ttl_s <= 0:
            raise ValueError(f"max_sessions must be >= 1 and idle_ttl_s > 0, not {max_sessions}, {idle_ttl_s}")
        self.pool, self.max_sessions, self.idle_ttl_s, self.clock = pool, max_sessions, idle_ttl_s, clock
        self._held: dict[str, _Held] = {}
        self._starting = 0
        self._expired: OrderedDict[str, None] = OrderedDict()  # recently reaped ids, for a clear 404
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_until_closed, name="sandbox-service-reaper", daemon=True)
        self._reaper.start()

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def create(self) -> str:
        self.reap()
        with self._lock:
            live = len(self._held) + self._starting
            if live >= self.max_sessions:
                raise HTTPException(503, f"the sandbox service holds {live} live sessions, its cap "
                                         f"(--max-sessions {self.max_sessions}): release finished ones "
                                         "(/release), or start the service with a larger --max-sessions",
                                    headers={"Retry-After": "5"})
            self._starting += 1
        try:
            box = self.pool.acquire()
        except SandboxUnavailableError as exc:
            raise HTTPException(503, str(exc)) from None
        finally:
            with self._lock:
                self._starting -= 1
        instance_id = secrets.token_hex(16)
        with self._lock:
            self._held[instance_id] = _Held(box, self.clock())
        return instance_id

    def _get(self, instance_id: str) -> _Held:
        held = self._held.get(instance_id)
        if held is None:
            if instance_id in self._expired:
                raise HTTPException(404, f"instance_id '{instance_id}' was released after {self.idle_ttl_s:g} s "
                                         "without a call (the service's --idle-ttl-s)")
            raise HTTPException(404, f"unknown instance_id '{instance_id}' (released, or never created)")
        return held

    @contextlib.contextmanager
    def use(self, instance_id: str) -> Iterator[Any]:
        """The session's sandbox, held busy (not reaped) while the block runs."""
        with self._lock:
            held = self._get(instance_id)
            held.busy += 1
            held.last_used = self.clock()
        try:
            yield held.box
        finally:
            with self._lock:
                held.busy -= 1
                held.last_used = self.clock()

    def replace(self, instance_id: str, box: Any) -> None:
        """A fresh sandbox for a session whose sandbox died (killed from the host, out of memory)."""
        with self._lock:
            self._held[instance_id].box = box

    def release(self, instance_id: str) -> bool:
        with self._lock:
            held = self._held.pop(instance_id, None)
        if held is not None:
            self.pool.release(held.box)
        return held is not None

    def reap(self) -> int:
        """Release the sessions idle for longer than `idle_ttl_s`; how many."""
        now = self.clock()
        with self._lock:
            stale = [i for i, held in self._held.items() if not held.busy and now - held.last_used > self.idle_ttl_s]
            boxes = [self._held.pop(i).box for i in stale]
            for instance_id in stale:
                self._expired[instance_id] = None
            while len(self._expired) > 4 * self.max_sessions:
                self._expired.popitem(last=False)
        for box in boxes:
            self.pool.release(box)
        if stale:
            log.info("sandbox service: released %d session(s) idle for more than %g s", len(stale), self.idle_ttl_s)
        return len(stale)

    def _reap_until_closed(self) -> None:
        while not self._stop.wait(min(30.0, max(0.05, self.idle_ttl_s / 4))):
            self.reap()

    def close(self) -> None:
        """Stop the reaper and release every live session."""
        self._stop.set()
        with self._lock:
            boxes = [held.box for held in self._held.values()]
            self._held.clear()
        for box in boxes:
            self.pool.release(box)


def create_app(pool: SandboxPool, token: str = "", *, max_sessions: int = MAX_SESSIONS,
               idle_ttl_s: float = IDLE_TTL_S) -> FastAPI:
    """The service over `pool` (its sandboxes, its limits): at most `max_sessions` live, each
    released after `idle_ttl_s` without a call. `app.state.sessions` is the `SessionTable`
    (close it when the app is done)."""
    sessions = SessionTable(pool, max_sessions, idle_ttl_s)

    app = FastAPI(title="ajet sandbox service", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sessions = sessions
    # the token before a byte of the body is read, and every body capped
    app.add_middleware(BodyGuard, max_body_bytes=MAX_BODY,
                       client_token=lambda path: None if path == HEALTH or not token else token)

    @app.get(HEALTH)
    def health() -> dict:
        return {"status": "ok", "env_types": [ENV_TYPE]}

    @app.post(LIST_TASKS)
    def list_tasks() -> dict:
        return {"task_ids": []}

    @app.post(CREATE)
    def create(req: SandboxCreateRequest) -> dict:
        if req.env_type != ENV_TYPE:
            raise HTTPException(404, f"unknown env_type '{req.env_type}'; this server offers ['{ENV_TYPE}']")
        instance_id = sessions.create()
        return {"instance_id": instance_id, "observation": "", "info": {"limits": dataclasses.asdict(pool.limits)}}

    @app.post(STEP)
    def step(req: StepRequest) -> dict:
        try:
            with sessions.use(req.instance_id) as box:
                return act(req, box)
        except (SandboxCrashed, SandboxRequestError) as exc:  # a dead sandbox, a path outside it
            raise HTTPException(409, str(exc)) from None

    def act(req: StepRequest, box: Any) -> dict:
        action = req.action
        if not isinstance(action, dict):
            raise HTTPException(422, "a sandbox's action is an object: {'code': ...}, {'command': ...}, "
                                     "{'files': ...} or {'read': path}")
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
        if not box.alive:  # the sandbox died: the next step gets a fresh one
            sessions.replace(req.instance_id, pool.acquire())
        return {"observation": result.as_tool_text(), "reward": 0.0, "done": False, "info": result.to_dict()}

    @app.post(EVALUATE)
    def evaluate(req: InstanceRequest) -> dict:
        with sessions.use(req.instance_id):
            return {"reward": 0.0, "is_success": False}

    @app.post(RELEASE)
    def release(req: InstanceRequest) -> dict:
        return {"released": sessions.release(req.instance_id)}

    return app


class RemoteSandbox:
    """A sandbox on a sandbox service: the calls of `Sandbox`, over HTTP."""

    def __init__(self, base_url: str, token: str = "", *, timeout_s: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.instance_id = ""
        self.base_url = base_url

    def start(self) -> RemoteSandbox:
        self.instance_id = self._post(CREATE, {"env_type": ENV_TYPE, "task_id": ""})["instance_id"]
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
        return self._post(STEP, {"instance_id": self.instance_id, "action": action})

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
                self.client.post(RELEASE, json={"instance_id": self.instance_id})
            except httpx.HTTPError:
                pass
            self.instance_id = ""
        self.client.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ajet's sandbox for model-written code, as an env service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--max-sessions", type=int, default=MAX_SESSIONS,
                        help="live sessions at once; /create answers 503 past it (default %(default)s)")
    parser.add_argument("--idle-ttl-s", type=float, default=IDLE_TTL_S,
                        help="a session without a call for this long is released (default %(default)s)")
    for field in dataclasses.fields(Limits):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    token = os.environ.get("AJET_SANDBOX_TOKEN", "")
    if not token and not is_loopback(args.host):
        parser.error(f"--host {args.host} without a token: anyone who reaches the port could run code; "
                     "set AJET_SANDBOX_TOKEN (clients send it as sandbox.service_token)")
    if args.max_sessions < 1 or args.idle_ttl_s <= 0:
        parser.error(f"--max-sessions must be at least 1 and --idle-ttl-s above 0, not "
                     f"{args.max_sessions} and {args.idle_ttl_s}")
    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    with SandboxPool(size=args.pool_size, limits=limits) as pool:
        app = create_app(pool, token, max_sessions=args.max_sessions, idle_ttl_s=args.idle_ttl_s)
        # header and idle deadlines, connection caps (docs/sandbox.md)
        http_server.serve(app, args.host, args.port)


if __name__ == "__main__":
    main()
