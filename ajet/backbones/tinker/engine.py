"""ajet's `InferenceEngine` over a Tinker `SamplingClient`: token ids in, token ids + logprobs out.

The tracker builds every prompt as token ids (token-in, token-out), and a Tinker sampler takes
exactly that (`ModelInput.from_ints`) and returns the sampled tokens with their logprobs, so the
gateway records the service's own tokens, as it records the local engine's. The sampler is
swapped after each update (`publish`): the episodes of a step all run on one version of the
weights (the backbone never overlaps rollout and update). What a sampler cannot do, the engine
declares (`EngineFeatures`: no grammar, penalties, top logprobs, streaming or other models) and
the gateway refuses by name. The conversions are pure and unit-tested; only `generate` talks to
the service.
"""

from __future__ import annotations

from typing import Any

from ajet.engine.base import Completion, EngineFeatures, SamplingParams
from ajet.errors import InfrastructureError


def tinker_sampling(params: SamplingParams) -> dict[str, Any]:
    """ajet sampling params -> the keyword arguments of Tinker's `SamplingParams` (pure).
    Raises ValueError for what a sampler cannot honour: logprobs at another temperature than
    the sampling one (the recorded logprobs must be the sampled distribution's)."""
    if params.logprob_temperature not in (None, params.temperature or 1.0):
        raise ValueError(f"logprob_temperature={params.logprob_temperature}: a Tinker sampler returns the logprobs "
                         "of the distribution it samples from")
    out: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": params.temperature,
                           "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1}
    if params.stop:
        out["stop"] = list(params.stop)
    if params.seed is not None:
        out["seed"] = params.seed
    return out


def sequence_to_completion(tokens: list[int], logprobs: list[float] | None, stop_reason: str, *,
                           policy_version: int) -> Completion:
    """One Tinker `SampledSequence`'s fields -> Completion (pure)."""
    if logprobs is None or len(logprobs) != len(tokens):
        raise InfrastructureError(f"the Tinker sampler returned {len(tokens)} tokens and "
                                  f"{'no' if logprobs is None else len(logprobs)} logprobs: training needs one "
                                  "logprob per sampled token")
    return Completion(token_ids=[int(t) for t in tokens], logprobs=[float(x) for x in logprobs],
                      finish_reason="length" if stop_reason == "length" else "stop", policy_version=policy_version)


class TinkerEngine(EngineFeatures):
    """`InferenceEngine` on a Tinker `SamplingClient` (the policy's latest sampler weights)."""

    decodes_a_copy = False  # no overlap on this backbone (its capabilities say so)

    def __init__(self, sampler: Any, *, policy_version: int = 0) -> None:
        self._sampler = sampler
        self._version = policy_version
        self._decoded = 0

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def adapters(self) -> tuple[str, ...]:
        """None by name: the sampler serves the policy alone (`supports_models` is False)."""
        return ()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        from tinker import types  # the SDK: imported by the backbone that needs it (ajet[tinker])

        sampler, version = self._sampler, self._version
        response = await sampler.sample(prompt=types.ModelInput.from_ints(list(prompt_ids)),
                                              num_samples=params.n,
                                              sampling_params=types.SamplingParams(**tinker_sampling(params)))
        out = [sequence_to_completion(list(seq.tokens), None if seq.logprobs is None else list(seq.logprobs),
                                      str(seq.stop_reason), policy_version=version)
               for seq in response.sequences]
        self._decoded += sum(len(c.token_ids) for c in out)
        return out

    def publish(self, sampler: Any, version: int) -> None:
        """Serve `sampler` (the weights of policy version `version`) from the next request on."""
        self._sampler, self._version = sampler, version

    def decoded_tokens(self) -> int:
        """Completion tokens returned so far (the RL recipe's tokens/s)."""
        return self._decoded

    def take_metrics(self) -> dict[str, float]:
        """None of its own: the service keeps its caches' counts."""
        return {}

    def bump_version(self) -> int:
        raise NotImplementedError("the tinker backbone publishes new sampler weights with publish()")

    def load_state_dict(self, state_dict: dict[str, Any]) -> int:
        raise NotImplementedError("the Tinker service holds the weights; publish() swaps the sampler")

    def close(self) -> None:
        """Nothing of its own to close: the service session closes with the backbone's client."""
