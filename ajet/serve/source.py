"""`ServedEpisodes`: the RL recipe's episode source under `ajet serve` (docs/episode_api.md).

An `EpisodeBroker` hands out the reader's tasks through the episode API on a public gateway;
each episode's calls reach the run's engine through the same gateway (per-episode keys, opened
by the run's `EngineRollout`), are recorded token by token, and the broker returns
`trainer.batch_size` complete groups per step (`ajet.rollout.source.EpisodeSource`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ajet.config.schema import AjetConfig
from ajet.files import write_json_atomic
from ajet.rollout.engine_rollout import EngineRollout, EpisodeHandle
from ajet.rollout.manager import RolloutResult
from ajet.serve.broker import EpisodeBroker
from ajet.serve.http import attach_episode_api
from ajet.tuner import Gateway
from ajet.workflow import WorkflowTask


@dataclass
class PublicSessions:
    """The broker's sessions: the run's own (`EngineRollout.open_episode`), with each episode's
    key on the public gateway that clients reach."""

    rollout: EngineRollout
    gateway: Gateway

    def open_episode(self, episode_id: str, task: WorkflowTask) -> EpisodeHandle:
        return self.rollout.open_episode(episode_id, task, gateway=self.gateway)


class ServedEpisodes:
    """An `EpisodeBroker` and the public gateway that serves its episode API and the
    per-episode model endpoint."""

    def __init__(self, broker: EpisodeBroker, gateway: Gateway, token: str) -> None:
        self.broker, self.gateway, self.token = broker, gateway, token
        # Clients may run episodes during an update when rollout.max_staleness > 0 (an attribute,
        # as EpisodeSource declares it: the broker's max_staleness is set once).
        self.overlaps_update = broker.max_staleness > 0

    @classmethod
    def start(cls, cfg: AjetConfig, *, rollout: EngineRollout, reader: Any, judge: Any, run_dir: Path,
              start_step: int, announce: Callable[[str], object]) -> ServedEpisodes:
        """Start the public gateway and the broker on the run's rollout; `announce(text)` tells
        the user where the API is."""
        gateway = Gateway(cfg.serve.host, cfg.serve.port).start()
        try:
            engine = rollout.engine
            broker = EpisodeBroker(
                reader, judge, PublicSessions(rollout, gateway), cfg.rollout, batch_size=cfg.trainer.batch_size,
                total_steps=cfg.trainer.total_steps, policy_version=lambda: engine.policy_version,
                max_staleness=cfg.rollout.max_staleness, start_step=start_step,
                public_metadata_keys=cfg.serve.public_metadata_keys, client_reward=cfg.serve.client_reward)
            token = attach_episode_api(gateway, broker, cfg.serve.client_token)
            served = cls(broker, gateway, token)
            announce(served.write_info(run_dir, generated=not cfg.serve.client_token))
        except BaseException:
            gateway.stop()
            raise
        return served

    def write_info(self, run_dir: Path, *, generated: bool) -> str:
        """Write RUN/serve.json (owner-only: it holds the client token); return what to tell the user."""
        root = self.gateway.base_url.removesuffix("/v1")
        info = {"base_url": self.gateway.base_url, "episodes_url": f"{root}/v1/episodes",
                "docs_url": f"{root}/docs", "client_token": self.token}
        path = run_dir / "serve.json"
        write_json_atomic(path, info, permissions=0o600)  # clients polling for it never read half of it
        shown = self.token if generated else "(serve.client_token)"
        return (f"ajet serve: episode API on {info['episodes_url']} (docs: {info['docs_url']}); "
                f"client token {shown}; all in {path}")

    async def next_batch(self, step: int) -> RolloutResult:
        return await self.broker.next_batch(step)

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.broker.record_metrics(step, metrics)

    def close(self) -> None:
        try:
            self.broker.close()
        finally:
            self.gateway.stop()
