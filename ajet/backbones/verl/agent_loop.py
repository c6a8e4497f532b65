"""The verl agent loop: one ajet episode per verl trajectory.

verl instantiates this class (named in RUN/verl/agent_loops.yaml) inside its agent-loop
worker actors, so it may import verl at the top. Each worker process builds one
`EpisodeRuntime` (user workflow, judge, tracker, gateway) on first use, against a
`VerlServerEngine` on verl's own vLLM servers; every `run` returns the episode's merged
sample as an `AgentLoopOutput`, which verl pads, scores (rm_scores = our reward on the
last token) and trains with its GRPO/RLOO/REINFORCE++ estimator.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from ajet.backbones.gpu import EpisodeRuntime
from ajet.backbones.verl.convert import (
    pick_episode_sample,
    sample_to_agent_loop_fields,
    task_from_extra_info,
)
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

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task, config_path = task_from_extra_info(kwargs["extra_info"])
        runtime = EpisodeRuntime.shared(config_path, self._engine, self.tokenizer)
        trajectory = kwargs.get("index", "")
        episode_id = f"{task.task_id}-{trajectory}-{id(self):x}"
        _, samples, metrics = await runtime.run(task, episode_id, group_id=task.task_id)
        sample, left_out = pick_episode_sample(samples)
        extra = {"turn_scores": [], "tool_rewards": [], "ajet_samples_left_out": left_out,
                 **{k: v for k, v in metrics.items()}}
        if sample is None:
            # verl needs one output per trajectory: an untrained stand-in with reward 0.
            prompt_ids = self.tokenizer.apply_chat_template(
                list(kwargs["raw_prompt"]), add_generation_prompt=True, tokenize=True)
            eos = self.tokenizer.eos_token_id
            return AgentLoopOutput(prompt_ids=list(prompt_ids)[-self.prompt_length:], response_ids=[eos],
                                   response_mask=[0], response_logprobs=[0.0], reward_score=0.0,
                                   num_turns=0, metrics=AgentLoopMetrics(),
                                   extra_fields={**extra, "ajet_failed": 1})
        fields = sample_to_agent_loop_fields(sample, max_prompt_length=self.prompt_length,
                                             max_response_length=self.response_length)
        return AgentLoopOutput(**fields, metrics=AgentLoopMetrics(), extra_fields={**extra, "ajet_failed": 0})
