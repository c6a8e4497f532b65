"""`EpisodeClient`: the Python client of the episode API (`ajet serve`, docs/episode_api.md).

    client = EpisodeClient("http://trainer:8000", token)
    while (episode := client.begin()) is not None:      # None: the run has ended
        llm = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key)
        ...                                               # calls recorded for training
        client.finish(episode.episode_id, reward=1.0)   # or metadata=... for the judge

Only httpx; nothing else of ajet is imported, so an agent's process stays light.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx


class EpisodeAPIError(RuntimeError):
    """The episode API answered an error: `status` (HTTP) and `code` (e.g. "episode_ended").
    (The server raises `ajet.serve.protocol.EpisodeRequestError` for it.)"""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


@dataclass
class RemoteEpisode:
    """An episode this client began: its task, and where and how to call the model."""

    episode_id: str
    task: dict[str, Any]  # task_id, main_query, init_messages, metadata, env_type
    base_url: str  # OpenAI-compatible; every call made with api_key is recorded
    api_key: str
    model: str


class EpisodeClient:
    def __init__(self, url: str, token: str, *, timeout_s: float = 60.0, wait_s: float = 600.0) -> None:
        """`url`: the server root (`http://host:port`; a trailing `/v1` is accepted); `token`: its
        client token; `wait_s`: how long `begin` waits while no episode is available."""
        self.url = url.rstrip("/").removesuffix("/v1")
        self.wait_s = wait_s
        self._keys: dict[str, str] = {}  # episode id -> its api_key, which finish and abort show
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token}"})

    def begin(self) -> RemoteEpisode | None:
        """The next episode; None once the run has ended. Waits (Retry-After) while the trainer
        has enough episodes in flight."""
        deadline = time.monotonic() + self.wait_s
        while True:
            response = self._http.post("/v1/episodes")
            if response.status_code == 410:
                return None
            if response.status_code != 503 or time.monotonic() > deadline:
                episode = RemoteEpisode(**self._json(response))
                self._keys[episode.episode_id] = episode.api_key
                return episode
            time.sleep(float(response.headers.get("retry-after", "1")))

    def finish(self, episode_id: str, reward: float | dict[str, float] | None = None, *, is_success: bool | None = None,
               metadata: dict[str, Any] | None = None, log_metrics: dict[str, float] | None = None) -> dict:
        """End the episode with `reward` (a number, or {role: reward}), or with `metadata` for the
        configured judge to score. Returns {episode_id, status, reward, role_rewards, is_success, reason, detail}."""
        body = {"reward": reward, "is_success": is_success, "metadata": metadata or {},
                "log_metrics": log_metrics or {}}
        return self._ended(episode_id, self._http.post(f"/v1/episodes/{episode_id}/finish", json=body,
                                                       headers=self._episode_key(episode_id)))

    def abort(self, episode_id: str, reason: str = "") -> dict:
        """Give the episode up: counted as failed, never trained on."""
        return self._ended(episode_id, self._http.post(f"/v1/episodes/{episode_id}/abort", json={"reason": reason},
                                                       headers=self._episode_key(episode_id)))

    def _episode_key(self, episode_id: str) -> dict[str, str]:
        """Only the client that began an episode may end it: its api_key goes along."""
        return {"X-Episode-Key": self._keys.get(episode_id, "")}

    def _ended(self, episode_id: str, response: httpx.Response) -> dict:
        """The answer to finish/abort; the key is forgotten once the episode has ended (a request
        that failed on the way, e.g. a 503 or a dropped connection, can be sent again with it)."""
        result = self._json(response)
        self._keys.pop(episode_id, None)
        return result

    def status(self) -> dict:
        """step, policy_version, episode counts, last_metrics."""
        return self._json(self._http.get("/v1/status"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EpisodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _json(response: httpx.Response) -> dict:
        if response.is_success:
            return response.json()
        try:
            error = response.json()["error"]
            code, message = error.get("code") or error.get("type", ""), error.get("message", "")
        except (ValueError, KeyError, TypeError, AttributeError):
            code, message = "", response.text[:500]
        raise EpisodeAPIError(response.status_code, code, message)
