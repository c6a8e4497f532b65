"""What the adapters whose environment runs in a process of its own share (verifiers, OpenEnv):
the server's address, the model's reply as an OpenAI assistant message, and calls to the
env-service protocol (`ajet.env_protocol`) that turn every failure into the episode's (`EnvError`).

The env-service client of `ajet.task_reader` sits above this layer; these calls are the few an
adapter needs, without its retries: a server that died fails the episode in flight (counted),
and the launcher restarts it for the next ones (`ServiceSpec.restart`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from ajet.env_protocol import TOKEN_ENV
from ajet.envs.base import EnvError
from ajet.errors import TaskReaderError
from ajet.net import CLIENT_KEEPALIVE_S


def episode_client(timeout_s: float) -> httpx.AsyncClient:
    """The HTTP client of one episode's requests (idle connections dropped: ajet.net.CLIENT_KEEPALIVE_S)."""
    return httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S))


def local_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def headers() -> dict[str, str]:
    """The env-service token (AJET_ENV_TOKEN, set by the launcher for the servers it starts)."""
    token = os.environ.get(TOKEN_ENV, "")
    return {"Authorization": f"Bearer {token}"} if token else {}


def assistant_message(response: Any) -> dict[str, Any]:
    """A tuner's reply (AgentScope `ChatResponse`) as the OpenAI assistant message it was: its text
    and its tool calls with their arguments as the model wrote them."""
    text = "".join(block["text"] for block in response.content if block.get("type") == "text")
    calls = [{"id": block["id"], "type": "function",
              "function": {"name": block["name"],
                           "arguments": block.get("raw_input") or json.dumps(block.get("input") or {})}}
             for block in response.content if block.get("type") == "tool_use"]
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def _answer(url: str, path: str, response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise EnvError(f"{url}{path} answered {response.status_code}: {str(detail)[:2000]}")
    try:
        body = response.json()
    except ValueError:
        raise EnvError(f"{url}{path} answered non-JSON: {response.text[:200]!r}") from None
    if not isinstance(body, dict):
        raise EnvError(f"{url}{path} answered {type(body).__name__}, not a JSON object")
    return body


def post(url: str, path: str, body: dict[str, Any], timeout_s: float, hint: str) -> dict[str, Any]:
    """One request while the tasks are made (before any episode): a failure stops the run with
    `hint` (how to start the server)."""
    try:
        response = httpx.post(f"{url}{path}", json=body, headers=headers(), timeout=timeout_s)
    except httpx.TransportError as exc:
        raise TaskReaderError(f"cannot reach the environment server at {url}: {type(exc).__name__}: {exc}. "
                              f"{hint}") from None
    try:
        return _answer(url, path, response)
    except EnvError as exc:
        raise TaskReaderError(str(exc)) from None


async def apost(client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One request during an episode: any failure (the server gone, an error answered) is the
    episode's."""
    try:
        response = await client.post(f"{url}{path}", json=body, headers=headers())
    except httpx.HTTPError as exc:
        raise EnvError(f"the environment server at {url} failed on {path}: {type(exc).__name__}: {exc}") from exc
    return _answer(url, path, response)
