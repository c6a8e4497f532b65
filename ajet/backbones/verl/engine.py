"""ajet's `InferenceEngine` over verl's rollout servers (token ids in and out).

Inside verl's agent-loop workers, `server_manager.generate(request_id, prompt_ids=...,
sampling_params=...)` returns a `TokenOutput(token_ids, log_probs, stop_reason)`; this
adapter turns ajet's `SamplingParams` into verl's dict and the output into a `Completion`.
The two conversions are pure and unit-tested; only `generate` talks to verl.
"""

from __future__ import annotations

import uuid
from typing import Any

from ajet.backbones.gpu_worker import vllm_sampling
from ajet.engine.base import Completion, EngineFeatures, SamplingParams
from ajet.errors import InfrastructureError


def verl_sampling_params(params: SamplingParams) -> dict[str, Any]:
    """ajet sampling params -> the dict verl's vLLM server takes (pure)."""
    return {**vllm_sampling(params), "logprobs": True}


def token_output_to_completion(token_ids: list[int], log_probs: list[float] | None, stop_reason: str | None,
                               *, max_tokens: int, eos_token_ids: set[int], policy_version: int) -> Completion:
    """verl's TokenOutput fields -> Completion (pure).

    verl reports "completed" for both EOS and length; "length" is told apart by the count:
    `max_tokens` tokens without a final EOS.
    """
    if stop_reason == "aborted":
        raise InfrastructureError("verl aborted the generation (weights were being synced); retry")
    if log_probs is None or len(log_probs) != len(token_ids):
        raise InfrastructureError(
            f"verl returned {len(token_ids)} tokens and "
            f"{'no' if log_probs is None else len(log_probs)} logprobs; "
            "set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    ended_by_eos = bool(token_ids) and token_ids[-1] in eos_token_ids
    finish = "length" if len(token_ids) >= max_tokens and not ended_by_eos else "stop"
    return Completion(token_ids=list(token_ids), logprobs=[float(x) for x in log_probs],
                      finish_reason=finish, policy_version=policy_version)


class VerlServerEngine(EngineFeatures):
    """`InferenceEngine` on verl's `LLMServerClient` (one per agent-loop worker)."""

    def __init__(self, server_manager: Any, *, eos_token_ids: set[int]) -> None:
        self.server_manager = server_manager
        self.eos_token_ids = set(eos_token_ids)
        self.policy_version = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        if params.n != 1:
            raise ValueError(f"n={params.n}: verl's server samples one completion per call")
        output = await self.server_manager.generate(
            request_id=uuid.uuid4().hex, prompt_ids=list(prompt_ids),
            sampling_params=verl_sampling_params(params),
        )
        version = (getattr(output, "extra_fields", None) or {}).get("global_steps")
        if isinstance(version, int):
            self.policy_version = version
        return [token_output_to_completion(
            output.token_ids, output.log_probs, getattr(output, "stop_reason", None),
            max_tokens=params.max_tokens, eos_token_ids=self.eos_token_ids,
            policy_version=self.policy_version,
        )]

    def bump_version(self) -> int:
        return self.policy_version

    def load_state_dict(self, state_dict: dict) -> int:
        raise NotImplementedError("verl syncs the rollout servers' weights itself")
