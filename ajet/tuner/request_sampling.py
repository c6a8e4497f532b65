"""A chat call's sampling: the rollout's defaults with the request's fields (`ajet.tuner.fields`).

Pure functions: what a request may set, checked and converted by each field's declaration, and
which of its values the engine cannot apply.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ajet.config.schema import RolloutConfig
from ajet.engine.base import InferenceEngine, SamplingParams
from ajet.engine.sampling import policy_temperature
from ajet.tuner.errors import UNSUPPORTED, InvalidRequestError
from ajet.tuner.fields import FIELDS, SAMPLING_FIELDS, missing_feature


def resolve_sampling(rollout: RolloutConfig, overrides: dict[str, Any]) -> SamplingParams:
    """The rollout defaults with a request's overrides, validated (pure).

    Accepted keys: the sampling fields of `ajet.tuner.fields.FIELDS` (temperature, top_p, top_k,
    seed, stop, max_tokens, max_completion_tokens, top_logprobs, n, the penalties and
    logit_bias), each checked by its declaration. `None` values mean "use the default".
    `logprob_temperature` is the rollout temperature (1.0 when greedy), whatever the request's
    temperature, so old logprobs match the trainer's recomputation.
    """
    params = SamplingParams(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_tokens=rollout.max_tokens,
    )
    values = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(values) - {spec.name for spec in SAMPLING_FIELDS}
    if unknown:
        raise InvalidRequestError(
            f"unsupported sampling parameter(s) {sorted(unknown)}; supported: "
            + ", ".join(spec.name for spec in SAMPLING_FIELDS))
    checked: dict[str, Any] = {}
    for spec in SAMPLING_FIELDS:
        if spec.name not in values:
            continue
        value = values[spec.name]
        if spec.honoured_values is not None and value not in spec.honoured_values:
            raise InvalidRequestError(f"{spec.name}={value!r}: {spec.why}"[:300], spec.name, UNSUPPORTED)
        try:
            checked[spec.name] = spec.check(value)
        except ValueError as err:
            raise InvalidRequestError(str(err), spec.name) from None
    if "max_completion_tokens" in checked:  # OpenAI's newer name: it wins when both are sent (vLLM, SGLang)
        checked["max_tokens"] = checked.pop("max_completion_tokens")
    for name, value in checked.items():
        setattr(params, name, value)
    # Logprobs are always computed at the rollout temperature, the one the trainer
    # recomputes them at, even when a request samples at its own temperature.
    params.logprob_temperature = policy_temperature(rollout.temperature)
    return params


def check_engine_features(engine: InferenceEngine, params: SamplingParams, vocab_size: int) -> None:
    """Penalties and logit_bias need an engine that applies them (and records the adjusted
    logprobs), top_logprobs one that returns alternatives (each field's `needs`); a bias names
    tokens of the model's vocabulary."""
    values = {spec.name: getattr(params, spec.name) for spec in FIELDS if spec.needs is not None}
    if (missing := missing_feature(engine, values)) is not None:
        name, why = missing
        raise InvalidRequestError(why, name, UNSUPPORTED)
    if params.logit_bias and max(params.logit_bias) >= vocab_size:
        raise InvalidRequestError(f"logit_bias: token id {max(params.logit_bias)} is not in the model's "
                                  f"vocabulary of {vocab_size} tokens", "logit_bias")


def call_seed(seed: int, episode_id: str, call: int) -> int:
    """The sampling seed of call `call` of `episode_id` under `rollout.seed` (stable across
    processes, unlike hash())."""
    digest = hashlib.sha256(f"{seed}/{episode_id}/{call}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
