"""The Trinity workflow plugin: one ajet episode per Trinity run.

Trinity imports this module (by the dotted name in `default_workflow_type`) inside its
workflow-runner actors, so it may import trinity at the top. Each runner process builds
one `EpisodeRuntime` (user workflow, judge, tracker, gateway) on first use, against an
`OpenAICompletionsEngine` on Trinity's vLLM OpenAI endpoint; every run then returns the
episode's merged samples as Trinity `Experience`s (steps of the run); a failed episode
returns none, which keeps it out of its group's advantage statistics.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from trinity.common.workflows.workflow import Workflow as TrinityWorkflow

from ajet.backbones.gpu_worker import EpisodeRuntime
from ajet.backbones.trinity.convert import episode_experience_fields, task_from_row, to_experiences
from ajet.backbones.trinity.engine import OpenAICompletionsEngine

log = logging.getLogger(__name__)


class AjetTrinityWorkflow(TrinityWorkflow):
    is_async = True
    can_reset = False
    can_repeat = False  # Trinity makes one instance per repeat; each is one episode

    def __init__(self, *, task: Any, model: Any, auxiliary_models: Any = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        try:
            self.config_path = task.workflow_args["ajet_config"]
        except KeyError:
            raise ValueError("workflow_args.ajet_config is missing; the taskset must come from "
                             "ajet's trinity translation") from None
        self.ajet_task = task_from_row(task.raw_task)

    def _engine(self, tokenizer: Any) -> OpenAICompletionsEngine:
        client = self.model.get_openai_async_client()  # resolves the server address
        model = self.model
        # `model_version_async` is an async *property*: each read is a new coroutine to await.
        return OpenAICompletionsEngine(
            str(client.base_url), model=client.model_path, api_key=model.api_key,
            version_fn=lambda: model.model_version_async,
        )

    async def run_async(self) -> list[Any]:
        runtime = EpisodeRuntime.shared(self.config_path, self._engine, self.model.model_path)
        task = self.ajet_task
        episode_id = f"{self.task.batch_id}-{task.task_id}-{uuid.uuid4().hex[:8]}"
        _, samples, metrics = await runtime.run(task, episode_id, group_id=task.task_id)
        return to_experiences(episode_experience_fields(samples, metrics))
