"""The verl agent loop: one ajet episode per verl trajectory.

verl instantiates this class (named in RUN/verl/agent_loops.yaml) inside its agent-loop
worker actors, so it may import verl at the top. Each worker process builds one
`EpisodeRuntime` (user workflow, judge, tracker, gateway) on first use, against a
`VerlServerEngine` on verl's own vLLM servers; every `run` returns the episode's merged
sample as an `AgentLoopOutput`, which verl pads, scores (rm_scores = our reward on the
last token) and trains with its GRPO/RLOO/REINFORCE++ estimator. A failed episode returns
no output, so it is not part of its group's advantage statistics (verl's v1 trainer,
`trainer.use_v1`, which the translation pins; see `convert.episode_outputs`).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from ajet.backbones.gpu_worker import EpisodeRuntime
from ajet.backbones.verl.convert import episode_outputs, task_from_extra_info
from ajet.backbones.verl.engine import VerlServerEngine

log = logging.getLogger(__name__)


class AjetAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length

    def _engine(self, tokenizer: Any) -> VerlServerEngine:
        eos = tokenizer.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        return VerlServerEngine(self.server_manager, eos_token_ids=eos_ids)

    def chat_prompt_ids(self, raw_prompt: Any) -> list[int]:
        """The row's chat prompt as token ids (the stand-in of an ok episode that trained nothing)."""
        # return_dict=False: transformers 5 returns a dict by default.
        return list(self.tokenizer.apply_chat_template(list(raw_prompt), add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """The episode's output, or none for a failed episode (verl's v1 worker takes a list:
        an empty one puts nothing for this session)."""
        task, config_path = task_from_extra_info(kwargs["extra_info"])
        runtime = EpisodeRuntime.shared(config_path, self._engine, self.tokenizer)
        trajectory = kwargs.get("index", "")
        episode_id = f"{task.task_id}-{trajectory}-{id(self):x}"
        episode, samples, metrics = await runtime.run(task, episode_id, group_id=task.task_id)
        outputs = episode_outputs(episode, samples, max_prompt_length=self.prompt_length,
                                  max_response_length=self.response_length,
                                  stand_in_prompt=lambda: self.chat_prompt_ids(kwargs["raw_prompt"]),
                                  eos_token_id=self.tokenizer.eos_token_id)
        returned = []
        for fields in outputs:
            extra = {"turn_scores": [], "tool_rewards": [], **metrics, **fields.pop("extra_fields")}
            returned.append(AgentLoopOutput(**fields, metrics=AgentLoopMetrics(), extra_fields=extra))
        return returned
