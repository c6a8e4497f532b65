"""Rollouts on an in-process model, for stages other than the RL trainer (DPO, evaluation).

`RolloutStack` builds what the debug backbone's trainer builds for its rollouts: the
local engine on the given model, the gateway for HTTP agents, one tracker + session +
tuner per episode, the task runner and the rollout manager. It also keeps each
episode's tracker, so the recorded calls (with their tool calls) can be read afterwards.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ajet.config.schema import AjetConfig, RolloutConfig

log = logging.getLogger(__name__)


class RecordingFactory:
    """Wraps a session factory; remembers the tracker of each episode's last attempt."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.trackers: dict[str, Any] = {}

    def open_episode(self, episode_id: str, task: Any) -> Any:
        handle = self.inner.open_episode(episode_id, task)
        self.trackers[episode_id] = handle.tracker
        return handle

    def calls(self, episode_id: str) -> list[Any]:
        tracker = self.trackers.get(episode_id)
        return list(tracker.calls) if tracker is not None else []


class RolloutStack:
    def __init__(self, cfg: AjetConfig, model: Any, tokenizer: Any, workflow: Any, *,
                 model_max_len: int, rollout: RolloutConfig | None = None) -> None:
        from ajet.backbones.debug.episodes import LocalSessionFactory
        from ajet.engine.chat import ChatFormat
        from ajet.engine.local import LocalEngine
        from ajet.judge import build_judge
        from ajet.rollout.manager import RolloutManager
        from ajet.rollout.runner import TaskRunner
        from ajet.tuner import Gateway

        rollout = rollout or cfg.rollout
        self.loop = asyncio.new_event_loop()
        self._closers: list[Any] = []
        self.chat = ChatFormat(tokenizer)
        self.judge = build_judge(cfg.judge, llm_client_factory=self._local_llm_client)
        self.engine = LocalEngine(model, tokenizer, max_batch_size=max(1, rollout.max_concurrency),
                                  max_model_len=model_max_len)
        self._closers.append(self.engine.close)
        self.gateway = Gateway()
        self.gateway.start()
        self._closers.append(self.gateway.stop)
        roles = list(cfg.workflow.trainable_targets) or list(getattr(workflow, "trainable_targets", None) or [])
        self.factory = RecordingFactory(LocalSessionFactory(
            engine=self.engine, chat=self.chat, gateway=self.gateway, rollout=rollout, context=cfg.context,
            trainable_roles=roles or None, model_max_len=model_max_len,
        ))
        self.runner = TaskRunner(workflow, self.judge, self.factory, rollout)
        self._closers.append(self.runner.close)
        self.manager = RolloutManager(self.runner, rollout)

    def _local_llm_client(self) -> Any:
        import openai

        from ajet.backbones.debug.episodes import service_api_key

        return openai.AsyncOpenAI(base_url=self.gateway.base_url, api_key=service_api_key(self.factory.inner))

    def rollout(self, tasks: list[Any], n: int, *, episode_prefix: str) -> Any:
        """`RolloutManager.rollout`, run to completion on this stack's event loop."""
        return self.loop.run_until_complete(self.manager.rollout(tasks, n, episode_prefix=episode_prefix))

    def close(self) -> None:
        for close in reversed(self._closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - keep closing the rest, but say what failed
                log.exception("error while shutting down %s", getattr(close, "__qualname__", close))
        self._closers.clear()
        self.loop.close()
