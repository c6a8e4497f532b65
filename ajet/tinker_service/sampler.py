"""Sampling for `ajet tinker`: a Tinker `SampleRequest` through the local engine
(`ajet.engine.local.LocalEngine.generate`, continuous batching, one adapter per row).

The tokens and logprobs returned are the engine's own (`Completion.token_ids` / `.logprobs`:
the logprob of each sampled token under the distribution it was sampled from, i.e. at the
request's temperature, as vLLM and Tinker report them). How the Tinker fields map:

- `num_samples` -> `n` (one prefill, n completions); `max_tokens`, `temperature`, `top_p`,
  `top_k` (-1 = off) and `seed` as they are;
- `stop`: strings are the engine's stop strings (the tokens up to and including the one that
  completed the string are returned); token ids that are the model's EOS stop exactly; other
  token ids also stop at their text, and the tokens are cut after the first one; `stop=[]`
  (generate past EOS) is refused by name;
- `topk_sample_logprobs` -> the engine's `top_logprobs`; `prompt_logprobs` and
  `prompt_logprobs_last_n` are computed by one forward of the sampler's model;
- `topk_prompt_logprobs`, `target_prompt_logprobs`, `prompt_alt_tokens_k` and
  `record_stability_info` are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ajet.engine.base import INITIAL_MODEL, Completion, SamplingParams
from ajet.engine.sampling import MAX_TOP_LOGPROBS
from ajet.tinker_service.errors import BadRequestError, NotServedError
from ajet.tinker_service.wire import SequenceOut

_REFUSED = {"topk_prompt_logprobs": "topk_prompt_logprobs", "target_prompt_logprobs": "target_prompt_logprobs",
            "prompt_alt_tokens_k": "prompt_alt_tokens_k", "record_stability_info": "record_stability_info"}


def prompt_tokens(prompt: dict[str, Any]) -> list[int]:
    """The token ids of a JSON `ModelInput` (encoded-text chunks only)."""
    tokens: list[int] = []
    for chunk in prompt.get("chunks") or []:
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise NotServedError(f"model_input chunks of type {chunk.get('type')!r}: only encoded text is served")
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    if not tokens:
        raise BadRequestError("sample: empty prompt")
    return tokens


def refuse_unserved(request: dict[str, Any]) -> None:
    for key, feature in _REFUSED.items():
        if request.get(key):
            raise NotServedError(f"sampling with {feature}")


def engine_params(params: dict[str, Any], num_samples: int, topk: int, eos: set[int],
                  decode: Callable[[list[int]], str]) -> tuple[SamplingParams, set[int]]:
    """(the engine's SamplingParams, the stop token ids to cut at afterwards)."""
    if not 1 <= num_samples <= 64:
        raise BadRequestError(f"num_samples={num_samples}: must be in [1, 64]")
    if not 0 <= topk <= MAX_TOP_LOGPROBS:
        raise BadRequestError(f"topk_sample_logprobs={topk}: must be in [0, {MAX_TOP_LOGPROBS}]")
    stop = params.get("stop")
    strings: list[str] = []
    cut: set[int] = set()
    if isinstance(stop, str):
        strings = [stop]
    elif isinstance(stop, list) and not stop:
        raise NotServedError("stop=[] (sampling on past EOS)")
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        strings = list(stop)
    elif isinstance(stop, list) and all(isinstance(s, int) for s in stop):
        cut = {int(s) for s in stop} - eos
        strings = [text for text in (decode([t]) for t in sorted(cut)) if text]
    elif stop is not None:
        raise BadRequestError(f"stop={stop!r}: give a string, a list of strings or a list of token ids")
    top_k = int(params.get("top_k", -1))
    max_tokens = params.get("max_tokens")
    sampling = SamplingParams(
        temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
        top_k=0 if top_k in (-1, 0) else top_k, max_tokens=int(max_tokens) if max_tokens is not None else 256,
        stop=strings, n=num_samples, seed=params.get("seed"), top_logprobs=topk)
    if top_k < -1:
        raise BadRequestError(f"top_k={top_k}: -1 (off) or a positive number")
    return sampling, cut


def sequence(completion: Completion, cut: set[int]) -> SequenceOut:
    """A completion as Tinker's sequence, cut after the first stop token id in `cut`."""
    tokens, logprobs, top = completion.token_ids, completion.logprobs, completion.top_logprobs
    stop = completion.finish_reason == "stop"
    at = next((i for i, t in enumerate(tokens) if t in cut), None)
    if at is not None:
        tokens, logprobs, top, stop = tokens[:at + 1], logprobs[:at + 1], top[:at + 1], True
    return SequenceOut(list(tokens), list(logprobs), stop, list(top))


def engine_model(adapter: str | None) -> str:
    """The engine's `model=` for a sampler: its adapter, or the base model's initial weights."""
    return adapter if adapter is not None else INITIAL_MODEL


def with_nan_first(logprobs: list[float], last_n: int | None) -> list[float]:
    """Prompt logprobs as Tinker gives them: NaN at position 0 (and before the last n)."""
    values = [math.nan, *logprobs]
    if last_n is not None:
        if not 1 <= last_n <= len(values) - 1:
            raise BadRequestError(f"prompt_logprobs_last_n={last_n}: must be in [1, {len(values) - 1}]")
        values = [math.nan] * (len(values) - last_n) + values[-last_n:]
    return values
