"""The rollout stack: what every backbone builds around an inference engine to run episodes.

engine (given) -> chat format -> gateway (HTTP agents) -> one tracker + session + tuner per
episode (`LocalSessionFactory`) -> `TaskRunner` (workflow, judge, retries, timeouts) ->
`RolloutManager` (groups of n, concurrency). The debug trainer, DPO and evaluation build it on
a `LocalEngine`; the Trinity plugin and the verl agent loop on the backbone's vLLM servers.
The engine belongs to the caller; `close()` stops what the stack started.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ajet.config.schema import AjetConfig, RolloutConfig
from ajet.engine.chat import ChatFormat
from ajet.judge import build_judge
from ajet.rollout.loader import trainable_targets_of
from ajet.rollout.manager import RolloutManager
from ajet.rollout.runner import TaskRunner
from ajet.rollout.session_factory import LocalSessionFactory, service_api_key
from ajet.tuner import Gateway

log = logging.getLogger(__name__)


def log_template_check(chat: Any) -> None:
    """The chat-template check (`ajet.context.diagnostics.report_template`), logged once per
    tokenizer: INFO when every message shape keeps its tokens, else a WARNING naming the shapes
    and what ajet does. A tracker's first prompt runs the same check, logged once between them."""
    from ajet.context.diagnostics import report_template

    report_template(chat)


class RolloutStack:
    def __init__(self, cfg: AjetConfig, engine: Any, tokenizer: Any, workflow: Any, *, model_max_len: int,
                 rollout: RolloutConfig | None = None, judge: Any = None,
                 wrap_factory: Callable[[Any], Any] | None = None) -> None:
        """`judge`: a judge built beforehand (None: built from `cfg.judge`, with LLM judges on
        the policy model through the gateway). `wrap_factory` wraps the session factory (e.g.
        to keep each episode's tracker)."""
        rollout = rollout or cfg.rollout
        self.engine = engine
        self.chat = ChatFormat(tokenizer)
        log_template_check(self.chat)
        self.gateway = Gateway().start()
        self.runner: Any = None
        try:
            self.sessions = LocalSessionFactory(
                engine=engine, chat=self.chat, gateway=self.gateway, rollout=rollout, context=cfg.context,
                trainable_targets=trainable_targets_of(cfg.workflow.trainable_targets, workflow),
                model_max_len=model_max_len,
            )
            self.factory = wrap_factory(self.sessions) if wrap_factory else self.sessions
            self.judge = judge if judge is not None else build_judge(cfg.judge, llm_client_factory=self.local_llm_client)
            self.runner = TaskRunner(workflow, self.judge, self.factory, rollout)
            self.manager = RolloutManager(self.runner, rollout)
        except BaseException:
            self.close()
            raise

    def local_llm_client(self) -> Any:
        """An OpenAI client on the gateway for in-run services (LLM judges) on the policy model:
        its calls are never recorded or trained."""
        import openai

        return openai.AsyncOpenAI(base_url=self.gateway.base_url, api_key=service_api_key(self.sessions))

    def close(self) -> None:
        for close in (getattr(self.runner, "close", None), self.gateway.stop):
            if close is None:
                continue
            try:
                close()
            except Exception:  # noqa: BLE001 - keep closing the rest, but say what failed
                log.exception("error while shutting down %s", getattr(close, "__qualname__", close))
