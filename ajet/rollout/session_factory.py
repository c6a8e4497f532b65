"""Per-episode state on an inference engine: a tracker, a session and a tuner per episode.

Used by every rollout stack: the debug backbone, DPO, evaluation and the GPU plugins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.context.tracker import ContextTracker
from ajet.tuner import EpisodeSession, ModelTuner
from ajet.workflow import WorkflowTask


@dataclass
class EpisodeHandle:
    tuner: Any
    tracker: Any
    session: Any

    def close(self) -> None:
        close_tuner = getattr(self.tuner, "close", None)
        if close_tuner is not None:
            close_tuner()
        self.session.close()


class LocalSessionFactory:
    """Opens episodes against the in-process engine (and the gateway, for HTTP agents)."""

    def __init__(self, *, engine: Any, chat: Any, gateway: Any, rollout: RolloutConfig,
                 context: ContextConfig, trainable_targets: list[str] | None, model_max_len: int) -> None:
        self.engine = engine
        self.chat = chat
        self.gateway = gateway
        self.rollout = rollout
        self.context = context
        self.trainable_targets = list(trainable_targets) if trainable_targets else None
        self.model_max_len = model_max_len

    def open_episode(self, episode_id: str, task: WorkflowTask) -> EpisodeHandle:
        roles = set(self.trainable_targets) if self.trainable_targets else None
        tracker = ContextTracker(self.chat, roles, self.context)
        session = EpisodeSession(
            episode_id, self.engine, self.chat, tracker, self.rollout, self.context, roles, self.model_max_len
        )
        tuner = ModelTuner(session, gateway=self.gateway, trainable_targets=self.trainable_targets)
        return EpisodeHandle(tuner=tuner, tracker=tracker, session=session)


class StatelessTracker:
    """Tracker for service calls (e.g. an LLM judge on the local model): nothing is kept or trained."""

    def __init__(self, chat: Any) -> None:
        self.chat = chat
        self.calls: list[Any] = []

    def build_prompt(
        self, role: str, messages: list[dict], tools: list[dict] | None, reply_prefix: str = ""
    ) -> list[int]:
        return self.chat.encode(self.chat.render(messages, tools, add_generation_prompt=True) + reply_prefix)

    def record(self, call: Any) -> None:
        """Service calls are not training data: dropped."""

    def timelines(self) -> list[Any]:
        return []

    def stats(self) -> dict[str, float]:
        return {}


def service_api_key(factory: LocalSessionFactory, name: str = "service") -> str:
    """A gateway key for in-run services (judges) on the policy model; never recorded or trained."""
    session = EpisodeSession(
        name, factory.engine, factory.chat, StatelessTracker(factory.chat), factory.rollout,
        factory.context, set(), factory.model_max_len,
    )
    return factory.gateway.register(session, "judge")
