"""Rollouts on an in-process model: a `LocalEngine` under the shared rollout stack.

The RL, DPO and evaluation recipes all roll out this way. `LocalRollout` owns the engine, the
stack (gateway, sessions, runner, manager) and an event loop; `rollout()` runs the manager to
completion on that loop. With `record=True` it keeps each episode's tracker so the recorded
calls (with their tool calls) can be read afterwards (evaluation).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ajet.config.schema import AjetConfig, RolloutConfig
from ajet.engine.local import LocalEngine
from ajet.models.resolve import resolve_model_path
from ajet.rollout.stack import RolloutStack

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


def initial_model_dir(cfg: AjetConfig) -> str | None:
    """The checkpoint directory default_model="initial" names (`model.initial_path`), or None
    for the weights the run starts from."""
    path = cfg.model.initial_path
    return str(resolve_model_path(path, cfg.model.cache_dir, key="model.initial_path")) if path else None


class LocalRollout:
    """`judge`: built beforehand (None: from `cfg.judge`, LLM judges on the policy model).
    `fixed_weights`: nothing will update the model (an evaluation; `LocalEngine`)."""

    def __init__(self, cfg: AjetConfig, model: Any, tokenizer: Any, workflow: Any, *,
                 model_max_len: int, rollout: RolloutConfig | None = None, judge: Any = None,
                 record: bool = False, fixed_weights: bool = False) -> None:
        rollout = rollout or cfg.rollout
        self.engine = LocalEngine(model, tokenizer, max_batch_size=max(1, rollout.max_concurrency),
                                  max_waiting=rollout.max_waiting_requests,
                                  max_model_len=model_max_len, prefix_cache_tokens=rollout.prefix_cache_tokens,
                                  dtype=rollout.engine_dtype.value, fixed_weights=fixed_weights,
                                  initial_model=initial_model_dir(cfg))
        try:
            self.stack = RolloutStack(cfg, self.engine, tokenizer, workflow, model_max_len=model_max_len,
                                      rollout=rollout, judge=judge,
                                      wrap_factory=RecordingFactory if record else None)
        except BaseException:
            self.engine.close()
            raise
        self.chat = self.stack.chat
        self.factory = self.stack.factory
        self.manager = self.stack.manager
        self.loop = asyncio.new_event_loop()

    def llm_client(self) -> Any:
        """An OpenAI client on the policy for in-run services (LLM judges): never recorded or trained."""
        return self.stack.local_llm_client()

    def rollout(self, tasks: list[Any], n: int, *, episode_prefix: str) -> Any:
        """`RolloutManager.rollout`, run to completion on this stack's event loop."""
        return self.loop.run_until_complete(self.manager.rollout(tasks, n, episode_prefix=episode_prefix))

    def close(self) -> None:
        self.stack.close()
        try:
            self.engine.close()
        except Exception:  # noqa: BLE001 - closing; say what failed
            log.exception("error while closing the engine")
        self.loop.close()
