"""The HTTP clients to ajet's local environment servers (an episode's, ajet.envs.service; the
env-service reader's, ajet.task_reader.env_client) drop a connection that has been idle for
ajet.net.CLIENT_KEEPALIVE_S, well before the server's keep-alive closes it (uvicorn's 5 s), so a
request sent after the model thought for a while never races the server's close (a ReadError
that failed, and reran, a whole verifiers episode)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ajet.envs.service import episode_client
from ajet.net import CLIENT_KEEPALIVE_S
from ajet.task_reader.env_client import AsyncEnvServiceClient
from ajet.task_reader.env_server import serve_in_thread


async def _port(request: Request) -> JSONResponse:
    assert request.client is not None
    return JSONResponse({"port": request.client.port})  # the client's side of the connection


def _env_service_client(url: str) -> httpx.AsyncClient:
    return AsyncEnvServiceClient(url)._http


@pytest.mark.parametrize("make", [lambda url: episode_client(10.0), _env_service_client],
                         ids=["episode", "env_service"])
def test_an_idle_connection_is_dropped_before_the_server_would_close_it(make: Callable[[str], Any]) -> None:
    assert CLIENT_KEEPALIVE_S < uvicorn.Config(app=None).timeout_keep_alive / 2

    async def ports(url: str, pause_s: float) -> list[int]:
        async with make(url) as client:
            first = (await client.post(f"{url}/p")).json()["port"]
            again = (await client.post(f"{url}/p")).json()["port"]  # at once: the same connection
            await asyncio.sleep(pause_s)  # the model thinks
            later = (await client.post(f"{url}/p")).json()["port"]
            return [first, again, later]

    with serve_in_thread(Starlette(routes=[Route("/p", _port, methods=["POST"])])) as url:
        first, again, later = asyncio.run(ports(url, CLIENT_KEEPALIVE_S + 0.5))
    assert first == again  # kept alive between requests in quick succession
    assert later != first  # a new connection after the idle pause, not the one the server may be closing
