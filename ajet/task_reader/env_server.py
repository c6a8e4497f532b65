"""The reference environment server: the env-service HTTP protocol over `KVStoreEnv`.

    python -m ajet.task_reader.env_server --port 8765      # host defaults to 127.0.0.1
    AJET_ENV_TOKEN=... python -m ajet.task_reader.env_server --host 10.0.0.7

With AJET_ENV_TOKEN set every route but /health needs `Authorization: Bearer <token>`
(`EnvServiceClient(token=...)`, which reads the same variable by default), checked before a
body is read; a token is required to listen beyond loopback. Bodies are capped at 1 MiB, and
the server runs with ajet's deadlines and connection caps (`ajet.http_server`).

The protocol (its routes and bodies) is `ajet.env_protocol`'s; any server that speaks it works
with `EnvServiceClient` and the env_service reader.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, HTTPException

from ajet import http_server
from ajet.env_protocol import (
    CREATE,
    EVALUATE,
    HEALTH,
    LIST_TASKS,
    RELEASE,
    STEP,
    TOKEN_ENV,
    CreateRequest,
    InstanceRequest,
    ListTasksRequest,
    StepRequest,
)
from ajet.net import is_loopback
from ajet.task_reader.kv_env import KVEpisode, KVStoreEnv
from ajet.tuner.http_guard import BodyGuard

logger = logging.getLogger(__name__)
MAX_BODY = 1 << 20  # an action or a task id: 1 MiB is plenty


def create_app(num_train: int = 32, num_val: int = 8, num_test: int = 16, token: str = "") -> FastAPI:
    """The app with a fresh instance table (one per server); with `token`, every route but
    /health needs it."""
    envs = {KVStoreEnv.env_type: KVStoreEnv(num_train=num_train, num_val=num_val, num_test=num_test)}
    instances: dict[str, tuple[KVStoreEnv, KVEpisode]] = {}
    lock = threading.Lock()
    counter = itertools.count()
    app = FastAPI(title="ajet reference env server")
    # the token before a byte of the body is read, and every body capped
    app.add_middleware(BodyGuard, max_body_bytes=MAX_BODY,
                       client_token=lambda path: None if path == HEALTH or not token else token)

    def env_for(env_type: str) -> KVStoreEnv:
        if env_type not in envs:
            raise HTTPException(404, f"unknown env_type '{env_type}'; this server offers {sorted(envs)}")
        return envs[env_type]

    def instance(instance_id: str) -> tuple[KVStoreEnv, KVEpisode]:
        with lock:
            if instance_id not in instances:
                raise HTTPException(404, f"unknown instance_id '{instance_id}' (released, or never created)")
            return instances[instance_id]

    @app.get(HEALTH)
    def health() -> dict:
        return {"status": "ok", "env_types": sorted(envs)}

    @app.post(LIST_TASKS)
    def list_tasks(req: ListTasksRequest) -> dict:
        return {"task_ids": env_for(req.env_type).list_tasks(req.split)}

    @app.post(CREATE)
    def create(req: CreateRequest) -> dict:
        env = env_for(req.env_type)
        try:
            episode, observation, info = env.create(req.task_id)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None
        with lock:
            instance_id = f"{req.env_type}-{next(counter)}"
            instances[instance_id] = (env, episode)
        return {"instance_id": instance_id, "observation": observation, "info": info}

    @app.post(STEP)
    def step(req: StepRequest) -> dict:
        env, episode = instance(req.instance_id)
        try:
            observation, reward, done, info = env.step(episode, req.action)
        except ValueError as exc:
            raise HTTPException(409, str(exc)) from None
        return {"observation": observation, "reward": reward, "done": done, "info": info}

    @app.post(EVALUATE)
    def evaluate(req: InstanceRequest) -> dict:
        env, episode = instance(req.instance_id)
        return env.evaluate(episode)

    @app.post(RELEASE)
    def release(req: InstanceRequest) -> dict:
        with lock:
            released = instances.pop(req.instance_id, None) is not None
        return {"released": released}

    return app


@contextmanager
def serve_in_thread(app: Any, timeout_s: float = 20.0) -> Iterator[str]:
    """`app` (an ASGI app, e.g. `create_app()`) served by uvicorn on a free local port in a
    daemon thread while the block runs; yields its base URL. For scripts and tests that need a
    server beside them (make_demos.py's scripted agent, the env-service tests)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = http_server.uvicorn_server(http_server.uvicorn_config(app, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {timeout_s:.0f} s")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ajet reference env server (key-value store tasks)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--num-train", type=int, default=32)
    parser.add_argument("--num-val", type=int, default=8)
    parser.add_argument("--num-test", type=int, default=16)
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if not token and not is_loopback(args.host):
        parser.error(f"--host {args.host} without a token: anyone who reaches the port could drive its "
                     f"environments; set {TOKEN_ENV} (clients send it as EnvServiceClient(token=...))")
    logging.basicConfig(level=logging.INFO)
    app = create_app(num_train=args.num_train, num_val=args.num_val, num_test=args.num_test, token=token)
    http_server.serve(app, args.host, args.port)


if __name__ == "__main__":
    main()
