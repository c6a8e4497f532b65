"""Rollouts on an inference engine: what every backbone builds around an engine to run episodes.

engine -> chat format -> gateway (HTTP agents) -> one tracker + session + tuner per episode
(`open_episode`) -> `TaskRunner` (workflow, judge, retries, timeouts) -> `RolloutManager`
(groups of n, concurrency). `EngineRollout.local(...)` builds it on an in-process `LocalEngine`
that it owns (the RL, DPO and evaluation recipes, `ajet episode`) and `rollout()` runs the
manager to completion on its own event loop; the Trinity plugin and the verl agent loop build
it on the backbone's vLLM servers (`EngineRollout(cfg, engine, ...)`: the engine is theirs).
With `record=True` it keeps each episode's tracker, so the recorded calls (with their tool
calls) can be read afterwards (evaluation, `ajet episode`). `close()` stops what it started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from ajet.config.schema import AjetConfig, RolloutConfig
from ajet.context.diagnostics import report_template
from ajet.context.tracker import ContextTracker
from ajet.context.types import LLMCall, Timeline
from ajet.engine.base import InferenceEngine
from ajet.engine.chat import ChatFormat
from ajet.engine.local import LocalEngine
from ajet.judge import Judge, build_judge
from ajet.rollout.local_engine import local_engine
from ajet.rollout.manager import RolloutManager, RolloutResult
from ajet.rollout.runner import TaskRunner
from ajet.rollout.workflow_loader import trainable_targets_of
from ajet.tuner import EpisodeSession, Gateway, ModelTuner
from ajet.workflow import Workflow, WorkflowTask

if TYPE_CHECKING:
    import openai
    import torch
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# The engine a rollout runs on: a `LocalEngine` (`EngineRollout.local`), or the backbone's servers.
E = TypeVar("E", bound=InferenceEngine)


@dataclass
class EpisodeHandle:
    """One episode attempt's tuner, tracker and session (`ajet.rollout.runner.EpisodeHandle`)."""

    tuner: ModelTuner
    tracker: ContextTracker
    session: EpisodeSession

    def close(self) -> None:
        close_tuner = getattr(self.tuner, "close", None)
        if close_tuner is not None:
            close_tuner()
        self.session.close()


class EngineRollout(Generic[E]):
    def __init__(self, cfg: AjetConfig, engine: E, tokenizer: PreTrainedTokenizerBase, workflow: Workflow, *,
                 model_max_len: int, rollout: RolloutConfig | None = None, judge: Judge | None = None,
                 record: bool = False, close_engine: Callable[[], object] | None = None) -> None:
        """`judge`: a judge built beforehand (None: built from `cfg.judge`, with LLM judges on
        the policy model through the gateway). `record`: keep each episode's tracker (`calls`).
        `close_engine`: what `close()` calls to close the engine too (one this rollout owns)."""
        self.rollout_config = rollout = rollout or cfg.rollout
        self.engine, self._close_engine = engine, close_engine
        self.context = cfg.context
        self.model_max_len = model_max_len
        self.trainable_targets = trainable_targets_of(cfg.workflow.trainable_targets, workflow)
        self.trackers: dict[str, ContextTracker] | None = {} if record else None
        self.chat = ChatFormat(tokenizer)
        log_template_check(self.chat)
        self.gateway = Gateway().start()
        self.runner: TaskRunner | None = None
        self.event_loop = asyncio.new_event_loop()  # what `rollout()` and the RL recipe run the manager on
        try:
            self.judge = judge if judge is not None else build_judge(cfg.judge, llm_client_factory=self.llm_client)
            self.runner = TaskRunner(workflow, self.judge, self, rollout)
            self.manager = RolloutManager(self.runner, rollout)
        except BaseException:
            self.close()
            raise

    @classmethod
    def local(cls, cfg: AjetConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, workflow: Workflow,
              *, model_max_len: int, rollout: RolloutConfig | None = None, judge: Judge | None = None,
              record: bool = False, fixed_weights: bool = False) -> EngineRollout[LocalEngine]:
        """On a `LocalEngine` of `model`, which it owns. `fixed_weights`: nothing will update
        the model (an evaluation)."""
        r = rollout or cfg.rollout
        engine = local_engine(cfg, model, tokenizer, model_max_len=model_max_len, rollout=r,
                              fixed_weights=fixed_weights)
        try:
            return EngineRollout(cfg, engine, tokenizer, workflow, model_max_len=model_max_len, rollout=r,
                                 judge=judge, record=record, close_engine=engine.close)
        except BaseException:
            engine.close()
            raise

    # ------------------------------------------------------------------ episodes
    def open_episode(self, episode_id: str, task: WorkflowTask, *, gateway: Gateway | None = None) -> EpisodeHandle:
        """A fresh tracker, session and tuner for one episode attempt (the runner's
        `SessionFactory`). `gateway`: where the episode's keys live (default: this rollout's;
        `ajet serve` puts them on its public one)."""
        roles = set(self.trainable_targets) if self.trainable_targets else None
        tracker = ContextTracker(self.chat, roles, self.context)
        session = EpisodeSession(episode_id, self.engine, self.chat, tracker, self.rollout_config, self.context,
                                 roles, self.model_max_len)
        tuner = ModelTuner(session, gateway=gateway or self.gateway, trainable_targets=self.trainable_targets)
        if self.trackers is not None:
            self.trackers[episode_id] = tracker  # the last attempt's
        return EpisodeHandle(tuner=tuner, tracker=tracker, session=session)

    def calls(self, episode_id: str) -> list[LLMCall]:
        """The recorded calls of an episode's last attempt (`record=True`)."""
        tracker = (self.trackers or {}).get(episode_id)
        return list(tracker.calls) if tracker is not None else []

    def rollout(self, tasks: list[WorkflowTask], n: int, *, episode_prefix: str) -> RolloutResult:
        """`RolloutManager.rollout`, run to completion on this rollout's own event loop."""
        return self.event_loop.run_until_complete(self.manager.rollout(tasks, n, episode_prefix=episode_prefix))

    def llm_client(self) -> openai.AsyncOpenAI:
        """An OpenAI client on the gateway for in-run services (LLM judges) on the policy model:
        its calls are never recorded or trained."""
        import openai

        return openai.AsyncOpenAI(base_url=self.gateway.base_url, api_key=self.service_api_key())

    def service_api_key(self, name: str = "service") -> str:
        """A gateway key for in-run services (judges) on the policy model; never recorded or trained."""
        session = EpisodeSession(name, self.engine, self.chat, StatelessTracker(self.chat), self.rollout_config,
                                 self.context, set(), self.model_max_len)
        return self.gateway.register(session, "judge")

    def close(self) -> None:
        # First the episodes a stop left running on the loop (Ctrl-C in `rollout()`): cancelled and
        # run to their ends while the engine and the gateway still serve their cleanup.
        closers = [lambda: cancel_pending(self.event_loop), getattr(self.runner, "close", None), self.gateway.stop]
        if self._close_engine is not None:
            closers.append(self._close_engine)
        for close in closers:
            if close is None:
                continue
            try:
                close()
            except Exception:  # noqa: BLE001 - keep closing the rest, but say what failed
                log.exception("error while shutting down %s", getattr(close, "__qualname__", close))
        self.event_loop.close()


# How long `cancel_pending` waits for cancelled episodes to finish their cleanup.
CANCEL_WAIT_S = 5.0


def cancel_pending(loop: asyncio.AbstractEventLoop, wait_s: float = CANCEL_WAIT_S) -> None:
    """Cancel the tasks that an interrupted `run_until_complete` left on `loop` and run it until
    they end (at most `wait_s`), as `asyncio.run` does when it ends. Closed with them pending,
    the loop printed "Task was destroyed but it is pending!" once per episode after a stop."""
    if loop.is_closed() or loop.is_running():
        return
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        _done, still = loop.run_until_complete(asyncio.wait(pending, timeout=wait_s))
        if still:
            log.warning("%d episode task(s) did not end within %g s of their cancellation", len(still), wait_s)
    # Not `loop.shutdown_asyncgens()` (asyncio.run's next step): it has no time limit, and an agent's
    # generator that awaits in its finally could hold the exit; a stop must end within `wait_s`.


class StatelessTracker:
    """Tracker for service calls (e.g. an LLM judge on the local model): nothing is kept or trained."""

    def __init__(self, chat: ChatFormat) -> None:
        self.chat = chat
        self.calls: list[LLMCall] = []

    def build_prompt(self, role: str, messages: list[dict[str, object]], tools: list[dict[str, object]] | None,
                     reply_prefix: str = "") -> list[int]:
        return self.chat.encode(self.chat.render(messages, tools, add_generation_prompt=True) + reply_prefix)

    def record(self, call: LLMCall) -> None:
        """Service calls are not training data: dropped."""

    def timelines(self) -> list[Timeline]:
        return []

    def stats(self) -> dict[str, float]:
        return {}


def log_template_check(chat: ChatFormat) -> None:
    """The chat-template check (`ajet.context.diagnostics.report_template`), logged once per
    tokenizer: INFO when every message shape keeps its tokens, else a WARNING naming the shapes
    and what ajet does. A tracker's first prompt runs the same check, logged once between them."""
    report_template(chat)

