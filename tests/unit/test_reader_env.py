"""Env-service reader, client and the reference key-value-store server, end to end over HTTP."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from ajet.config.schema import EnvServiceReaderConfig, ReaderType, TaskReaderConfig
from ajet.launcher import free_port
from ajet.task_reader import (
    AsyncEnvServiceClient,
    EnvServiceClient,
    EnvServiceError,
    TaskReaderError,
    build_reader,
)
from ajet.task_reader.env_server import serve_in_thread as serve
from ajet.task_reader.kv_env import KVStoreEnv, make_task


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    from ajet.task_reader.env_server import create_app

    with serve(create_app(num_train=12, num_val=4, num_test=3)) as url:
        yield url


def env_cfg(base_url: str, **kw) -> TaskReaderConfig:
    return TaskReaderConfig(type=ReaderType.env_service, shuffle=False,
                            env_service=EnvServiceReaderConfig(base_url=base_url, **kw))


def oracle_actions(task_id: str) -> list[dict]:
    """Actions that reach the goal store of a generated task (known to the test, not the agent)."""
    split, index = task_id.split("-")[1], int(task_id.split("-")[2])
    task = make_task(split, index)
    actions: list[dict] = [{"action": "delete", "key": k} for k in task.initial if k not in task.goal]
    actions += [{"action": "set", "key": k, "value": v} for k, v in task.goal.items()
                if task.initial.get(k) != v]
    return actions + [{"action": "done"}]


def test_unreachable_service_says_url_and_how_to_start() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(TaskReaderError) as info:
        build_reader(env_cfg(url, env_type="kv_store", request_timeout_s=2, retry_s=1), seed=0)
    message = str(info.value)
    assert url in message
    assert "must be running" in message
    assert "python -m ajet.task_reader.env_server" in message


def test_reader_lists_tasks_from_service(server_url: str) -> None:
    reader = build_reader(env_cfg(server_url, env_type="kv_store", num_train_tasks=5,
                                  num_val_tasks=2), seed=0)
    train, val = reader.train_tasks(), reader.val_tasks()
    assert [t.task_id for t in train] == [f"kv-train-{i:03d}" for i in range(5)]
    assert [t.task_id for t in val] == ["kv-val-000", "kv-val-001"]
    assert all(t.env_type == "kv_store" for t in train + val)
    assert train[0].metadata == {"env_base_url": server_url, "split": "train"}
    # num_train_tasks <= 0 means all the service offers
    assert len(build_reader(env_cfg(server_url, env_type="kv_store", num_train_tasks=0),
                            seed=0).train_tasks()) == 12
    assert reader.test_tasks() == []  # num_test_tasks=0: no test split


def test_reader_reads_the_services_test_split_apart_from_train_and_val(server_url: str) -> None:
    reader = build_reader(env_cfg(server_url, env_type="kv_store", num_train_tasks=0, num_val_tasks=4,
                                  num_test_tasks=5), seed=0)
    test = reader.test_tasks()
    # fewer offered (3) than asked (5): all of them, with a warning
    assert [t.task_id for t in test] == ["kv-test-000", "kv-test-001", "kv-test-002"]
    assert all(t.metadata["split"] == "test" for t in test)
    train_val = {t.task_id for t in reader.train_tasks() + reader.val_tasks()}
    assert not train_val & {t.task_id for t in test}
    # held out as tasks, not only as ids: no test instruction and start store is a train or val one's
    seen = {(make_task(s, i).instruction, tuple(sorted(make_task(s, i).initial.items())))
            for s, n in (("train", 12), ("val", 4)) for i in range(n)}
    assert not seen & {(make_task("test", i).instruction, tuple(sorted(make_task("test", i).initial.items())))
                       for i in range(3)}


def test_env_type_must_be_offered(server_url: str) -> None:
    with pytest.raises(TaskReaderError, match=r"env_type is empty.*\['kv_store'\]"):
        build_reader(env_cfg(server_url), seed=0)
    with pytest.raises(TaskReaderError, match=r"no env_type 'chess'.*\['kv_store'\]"):
        build_reader(env_cfg(server_url, env_type="chess"), seed=0)


@pytest.mark.parametrize("task_id", ["kv-train-000", "kv-train-007", "kv-val-003"])
def test_oracle_agent_succeeds(server_url: str, task_id: str) -> None:
    with EnvServiceClient(server_url) as env:
        created = env.create("kv_store", task_id)
        assert "Goal:" in created["observation"] and '"action"' in created["observation"]
        iid = created["instance_id"]
        for action in oracle_actions(task_id):
            result = env.step(iid, action)
        assert result["done"] is True and result["reward"] == 1.0
        scored = env.evaluate(iid)
        assert scored["reward"] == 1.0 and scored["is_success"] is True
        env.release(iid)
        with pytest.raises(EnvServiceError, match="404.*unknown instance_id"):
            env.evaluate(iid)


def test_idle_agent_fails_and_get_reads_values(server_url: str) -> None:
    task = make_task("train", 1)
    key, value = next(iter(task.initial.items()))
    with EnvServiceClient(server_url) as env:
        iid = env.create("kv_store", task.task_id)["instance_id"]
        # an LLM's reply: prose around the JSON action is accepted
        got = env.step(iid, f'I will read it first. {{"action": "get", "key": "{key}"}}')
        assert got["observation"] == f"{key} = {value}" and got["done"] is False
        bad = env.step(iid, {"action": "fly"})
        assert "unknown action" in bad["observation"] and bad["info"]["error"]
        end = env.step(iid, {"action": "done"})
        assert end["done"] is True and 0.0 <= end["reward"] < 1.0
        assert env.evaluate(iid)["is_success"] is False
        with pytest.raises(EnvServiceError, match="409.*finished"):
            env.step(iid, {"action": "list"})


def test_episode_ends_when_out_of_steps(server_url: str) -> None:
    task = make_task("train", 2)
    with EnvServiceClient(server_url) as env:
        iid = env.create("kv_store", task.task_id)["instance_id"]
        results = [env.step(iid, {"action": "list"}) for _ in range(task.max_steps)]
    assert [r["done"] for r in results] == [False] * (task.max_steps - 1) + [True]
    assert "out of steps" in results[-1]["observation"]


def test_unknown_task_and_env_type(server_url: str) -> None:
    with EnvServiceClient(server_url) as env:
        with pytest.raises(EnvServiceError, match="unknown task_id 'kv-train-999'"):
            env.create("kv_store", "kv-train-999")
        with pytest.raises(EnvServiceError, match="unknown env_type 'x'"):
            env.list_tasks("x")


def test_async_client_runs_an_episode(server_url: str) -> None:
    async def episode() -> dict:
        async with AsyncEnvServiceClient(server_url) as env:
            assert "kv-val-000" in await env.list_tasks("kv_store", "val")
            iid = (await env.create("kv_store", "kv-val-000"))["instance_id"]
            for action in oracle_actions("kv-val-000"):
                await env.step(iid, action)
            result = await env.evaluate(iid)
            await env.release(iid)
            return result

    assert asyncio.run(episode())["is_success"] is True


def test_tasks_are_deterministic_and_solvable() -> None:
    for split in ("train", "val"):
        for i in range(30):
            a, b = make_task(split, i), make_task(split, i)
            assert a == b
            assert a.goal != a.initial  # there is always something to do
            assert len(oracle_actions(a.task_id)) <= a.max_steps
    assert make_task("train", 0).instruction != make_task("val", 0).instruction


def test_server_runs_as_a_module() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ajet.task_reader.env_server", "--port", str(port),
                             "--num-train", "3"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
        assert health == {"status": "ok", "env_types": ["kv_store"]}
        with EnvServiceClient(f"http://127.0.0.1:{port}") as env:
            assert env.list_tasks("kv_store") == ["kv-train-000", "kv-train-001", "kv-train-002"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_service_without_health_endpoint() -> None:
    """/health is optional: a minimal service answering only list_tasks still works."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/list_tasks")
    def list_tasks(body: dict) -> dict:
        return {"task_ids": [f"{body['env_type']}-{body['split']}-{i}" for i in range(3)]}

    with serve(app) as url:
        reader = build_reader(env_cfg(url, env_type="maze"), seed=0)
    assert [t.task_id for t in reader.train_tasks()] == ["maze-train-0", "maze-train-1", "maze-train-2"]


@pytest.mark.parametrize("path, answer, says", [
    ("/create", {"observation": "x"}, "'instance_id' (missing)"),
    ("/step", {"observation": "o", "reward": "lots", "done": False}, "'reward' (got 'lots')"),
    ("/step", ["not", "an", "object"], "answered list"),
    ("/evaluate", {"is_success": True}, "'reward' (missing)"),
    ("/list_tasks", {"task_ids": "abc"}, "'task_ids'"),
])
def test_an_env_service_answer_of_the_wrong_shape_names_the_service_and_the_field(
        path: str, answer: object, says: str) -> None:
    """Before (issue 53): a raw KeyError or AttributeError deep in the workflow."""
    import asyncio

    import httpx

    from ajet.errors import EnvServiceError
    from ajet.task_reader.env_client import AsyncEnvServiceClient, EnvServiceClient

    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    calls = {"/create": ("create", ("env", "t1")), "/step": ("step", ("i1", "left")),
             "/evaluate": ("evaluate", ("i1",)), "/list_tasks": ("list_tasks", ("env",))}
    name, args = calls[path]
    client = EnvServiceClient("http://env:8080", retry_s=0)
    client._http = httpx.Client(base_url="http://env:8080", transport=transport)
    with pytest.raises(EnvServiceError) as info:
        getattr(client, name)(*args)
    assert "env service http://env:8080" in str(info.value) and says in str(info.value), str(info.value)
    aclient = AsyncEnvServiceClient("http://env:8080", retry_s=0)
    aclient._http = httpx.AsyncClient(base_url="http://env:8080", transport=transport)
    with pytest.raises(EnvServiceError, match="env service http://env:8080"):
        asyncio.run(getattr(aclient, name)(*args))


def test_the_reference_server_with_a_token_refuses_before_the_body_and_beyond_loopback(monkeypatch) -> None:
    from ajet.task_reader.env_server import create_app, main

    with serve(create_app(num_train=2, num_val=1, num_test=1, token="t0k")) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        refused = httpx.post(f"{url}/list_tasks", content=b"x" * 100_000)
        assert refused.status_code == 401 and refused.headers["connection"] == "close"
        assert httpx.post(f"{url}/list_tasks", json={"env_type": "kv_store"},
                          headers={"Authorization": "Bearer t0k"}).status_code != 401
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # 2 MiB declared: 413 unread
            sock.sendall(f"POST /list_tasks HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer t0k\r\n"
                         f"Content-Length: {2 << 20}\r\n\r\n".encode())
            assert b" 413 " in sock.recv(4096).split(b"\r\n", 1)[0]
        with EnvServiceClient(url, token="t0k") as client:
            assert client.health()
    monkeypatch.delenv("AJET_ENV_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        main(["--host", "0.0.0.0"])


def test_both_env_servers_take_the_one_protocols_bodies() -> None:
    """Issue 70: `CreateRequest`, `StepRequest` and `InstanceRequest` had two homes with different
    field types (the sandbox's action a dict, the env server's anything); both servers now use
    ajet.env_protocol's, and every route they serve is one of its routes."""
    from ajet import env_protocol
    from ajet.sandbox.pool import SandboxPool
    from ajet.sandbox.service import create_app as sandbox_app
    from ajet.task_reader.env_server import create_app as env_app

    routes = {env_protocol.HEALTH, env_protocol.LIST_TASKS, env_protocol.CREATE, env_protocol.STEP,
              env_protocol.EVALUATE, env_protocol.RELEASE}
    pool = SandboxPool.__new__(SandboxPool)  # the app only keeps it: nothing starts
    sandbox = sandbox_app(pool)
    for app in (env_app(), sandbox):
        served = {r.path for r in app.routes if getattr(r, "methods", None)}
        assert routes <= served and not served - routes - {"/docs", "/docs/oauth2-redirect", "/redoc",
                                                            "/openapi.json"}, served
        for route in app.routes:
            body = getattr(getattr(route, "body_field", None), "type_", None)
            if body is not None:
                assert issubclass(body, env_protocol.BaseModel) and body.__module__ in (
                    "ajet.env_protocol", "ajet.sandbox.service"), (route.path, body)
                assert issubclass(body, (env_protocol.ListTasksRequest, env_protocol.CreateRequest,
                                         env_protocol.StepRequest, env_protocol.InstanceRequest))
    sandbox.state.sessions.close()


def test_keyed_actions_need_a_string_key_and_the_rest_do_not() -> None:
    env = KVStoreEnv(num_train=1, num_val=0, num_test=0)
    for name in ("get", "set", "delete"):
        episode, _, _ = env.create("kv-train-000")
        observation, _, _, info = env.step(episode, {"action": name, "key": 3, "value": "x"})
        assert info["error"] == f"'{name}' needs a string 'key'" and observation.startswith("error: ")
    episode, _, _ = env.create("kv-train-000")
    assert env.step(episode, {"action": "set", "key": "k"})[3]["error"] == "'set' needs a 'value'"
    assert env.step(episode, {"action": "set", "key": "k", "value": 5})[0] == "ok: k = 5"
    assert env.step(episode, {"action": "delete", "key": "k"})[0] == "ok: deleted k"
    assert env.step(episode, {"action": "delete", "key": "k"})[0] == "k was not there"
    assert "error" not in env.step(episode, {"action": "list"})[3]
