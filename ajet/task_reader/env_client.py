"""Clients for the env-service HTTP protocol (`ajet.env_protocol`).

`EnvServiceClient` is synchronous (the reader lists tasks with it); `AsyncEnvServiceClient`
has the same methods as coroutines, for workflows that drive an environment inside the
rollout's event loop. Both retry what is safe to send again (`ajet.retry`), then raise
`EnvServiceError` with the URL and what to do.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx
from pydantic import ValidationError

from ajet.env_protocol import (
    ANSWERS,
    CREATE,
    EVALUATE,
    HEALTH,
    LIST_TASKS,
    NOT_IDEMPOTENT,
    RELEASE,
    STEP,
    TOKEN_ENV,
)
from ajet.errors import EnvServiceError
from ajet.net import CLIENT_KEEPALIVE_S
from ajet.retry import asend_with_retries, send_with_retries

logger = logging.getLogger(__name__)

START_HINT = (
    "The env service must be running; start the reference server with "
    "`python -m ajet.task_reader.env_server --port 8765` (or set task_reader.env_service.base_url)"
)


def _unreachable(url: str, exc: Exception) -> EnvServiceError:
    return EnvServiceError(f"cannot reach the env service at {url}: {type(exc).__name__}: {exc}. {START_HINT}")


def _checked(url: str, path: str, result: Any) -> Any:
    """`result` if it has the fields `path` answers with, else an error naming the service, the
    field and what was expected (rather than a KeyError deep in a workflow)."""
    shape = ANSWERS.get(path)
    if shape is None:
        return result
    if not isinstance(result, dict):
        raise EnvServiceError(f"env service {url} answered {type(result).__name__} {str(result)[:120]!r}; expected "
                              f"a JSON object with {', '.join(shape.model_fields)}")
    try:
        shape.model_validate(result)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "?"
        got = "missing" if error["type"] == "missing" else f"got {str(error.get('input'))[:80]!r}"
        raise EnvServiceError(f"env service {url} answered without a valid '{field}' ({got}): {error['msg']}; "
                              f"{path} must answer {{{', '.join(shape.model_fields)}}}") from None
    return result


def _result(url: str, response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise EnvServiceError(
            f"env service {url} answered {response.status_code}: {detail}", response.status_code
        )
    try:
        return response.json()
    except ValueError:
        raise EnvServiceError(f"env service {url} answered non-JSON: {response.text[:200]!r}") from None


def _auth(token: str | None) -> dict[str, str]:
    """The bearer header of `token` (None: the server's variable, TOKEN_ENV; empty: none)."""
    token = os.environ.get(TOKEN_ENV, "") if token is None else token
    return {"Authorization": f"Bearer {token}"} if token else {}


class EnvServiceClient:
    """Blocking client: `create`, `step`, `evaluate`, `release`, `list_tasks`, `health`."""

    def __init__(self, base_url: str, timeout: float = 30.0, retry_s: float = 30.0, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry_s = retry_s
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=_auth(token),
                                  limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EnvServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = send_with_retries(lambda: self._http.request(method, path, json=body), what=f"env service {url}",
                                         idempotent=path not in NOT_IDEMPOTENT, max_wait_s=self.retry_s)
        except httpx.TransportError as exc:
            raise _unreachable(url, exc) from exc
        return _checked(url, path, _result(url, response))

    def health(self) -> dict:
        return self._call("GET", HEALTH)

    def list_tasks(self, env_type: str, split: str = "train") -> list[str]:
        return list(self._call("POST", LIST_TASKS, {"env_type": env_type, "split": split})["task_ids"])

    def create(self, env_type: str, task_id: str) -> dict:
        """-> {instance_id, observation, info}"""
        return self._call("POST", CREATE, {"env_type": env_type, "task_id": task_id})

    def step(self, instance_id: str, action: Any) -> dict:
        """-> {observation, reward, done, info}; `action` is a dict or the agent's text."""
        return self._call("POST", STEP, {"instance_id": instance_id, "action": action})

    def evaluate(self, instance_id: str) -> dict:
        """-> {reward, is_success, ...}"""
        return self._call("POST", EVALUATE, {"instance_id": instance_id})

    def release(self, instance_id: str) -> None:
        self._call("POST", RELEASE, {"instance_id": instance_id})


class AsyncEnvServiceClient:
    """The same protocol as `EnvServiceClient`, as coroutines."""

    def __init__(self, base_url: str, timeout: float = 30.0, retry_s: float = 30.0, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry_s = retry_s
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=_auth(token),
                                       limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncEnvServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            async def send() -> httpx.Response:
                return await self._http.request(method, path, json=body)

            response = await asend_with_retries(send, what=f"env service {url}", idempotent=path not in NOT_IDEMPOTENT,
                                                max_wait_s=self.retry_s)
        except httpx.TransportError as exc:
            raise _unreachable(url, exc) from exc
        return _checked(url, path, _result(url, response))

    async def health(self) -> dict:
        return await self._call("GET", HEALTH)

    async def list_tasks(self, env_type: str, split: str = "train") -> list[str]:
        result = await self._call("POST", LIST_TASKS, {"env_type": env_type, "split": split})
        return list(result["task_ids"])

    async def create(self, env_type: str, task_id: str) -> dict:
        return await self._call("POST", CREATE, {"env_type": env_type, "task_id": task_id})

    async def step(self, instance_id: str, action: Any) -> dict:
        return await self._call("POST", STEP, {"instance_id": instance_id, "action": action})

    async def evaluate(self, instance_id: str) -> dict:
        return await self._call("POST", EVALUATE, {"instance_id": instance_id})

    async def release(self, instance_id: str) -> None:
        await self._call("POST", RELEASE, {"instance_id": instance_id})
