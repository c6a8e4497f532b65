"""Per-request sampling: parameter checks, next-token choice, logprobs, stop strings.

Pure functions over logits rows, so their behaviour is testable without a model.

Logprob convention (what `Completion.logprobs` holds): the log-probability of each sampled
token under `log_softmax(logits / T_lp)`, where `T_lp` is

- `params.logprob_temperature` when set (e.g. 1.0 to get the untempered model logprob), else
- the sampling temperature, or 1.0 for greedy decoding (temperature 0).

The trainer recomputes new logprobs the same way (`log_softmax(logits / temperature)`), so
PPO ratios compare like with like. top-k / top-p truncation is *not* folded into the
logprob: it is a sampling-time filter that the trainer cannot reproduce from logits alone.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ajet.engine.base import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    import torch


def stop_strings(params: SamplingParams) -> list[str]:
    """The request's stop strings as a list (a bare string is accepted as one stop)."""
    stop = params.stop
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return list(stop)


def validate_params(params: SamplingParams) -> None:
    """Raise `ValueError` naming the bad field; the engine calls this before queueing."""
    if params.temperature < 0:
        raise ValueError(f"temperature={params.temperature}: must be >= 0 (0 = greedy)")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p={params.top_p}: must be in (0, 1]")
    if params.top_k < 0:
        raise ValueError(f"top_k={params.top_k}: must be >= 0 (0 = off)")
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens={params.max_tokens}: must be >= 1")
    if params.n < 1:
        raise ValueError(f"n={params.n}: must be >= 1")
    lp_t = params.logprob_temperature
    if lp_t is not None and lp_t <= 0:
        raise ValueError(f"logprob_temperature={lp_t}: must be > 0 (or None)")
    for stop in stop_strings(params):
        if not isinstance(stop, str) or not stop:
            raise ValueError(f"stop={params.stop!r}: stop strings must be non-empty strings")


def logprob_temperature(params: SamplingParams) -> float:
    """The temperature the returned logprobs are computed at (see the module docstring)."""
    lp_t = params.logprob_temperature
    if lp_t is not None:
        return float(lp_t)
    return float(params.temperature) if params.temperature > 0 else 1.0


def make_generator(seed: int | None, index: int) -> torch.Generator:
    """A CPU generator for completion `index` of a request.

    Each completion gets its own stream, so its tokens do not depend on when its siblings
    (n > 1) finish or what else shares the batch. `seed=None` draws a fresh random seed.
    """
    import torch

    if seed is None:
        base = secrets.randbits(62)
    else:
        # Mix (seed, index) so that (seed=1, index=1) and (seed=2, index=0) differ.
        base = (int(seed) * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) % (2**62)
    return torch.Generator(device="cpu").manual_seed(base)


@dataclass
class TokenChoice:
    token_id: int
    logprob: float


def choose_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> TokenChoice:
    """Pick the next token from one row of float logits `[vocab]` and return its logprob."""
    import torch

    logits = logits.float()
    if params.temperature == 0:
        token = int(torch.argmax(logits))
    else:
        scaled = logits / params.temperature
        if params.top_k > 0 and params.top_k < scaled.numel():
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1.0:
            probs = _top_p_filter(probs, params.top_p)
        if not bool(torch.isfinite(probs).all()):
            raise FloatingPointError("non-finite probabilities (the model produced NaN/inf logits)")
        token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
    lp_t = logprob_temperature(params)
    logprob = float(torch.log_softmax(logits / lp_t, dim=-1)[token])
    return TokenChoice(token, logprob)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p`."""
    import torch

    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p  # the first token is always kept
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    kept = probs.masked_fill(drop, 0.0)
    return kept / kept.sum()


def find_stop(text: str, stops: list[str]) -> int:
    """Index where the earliest stop string starts in `text`, or -1 when none occurs."""
    best = -1
    for stop in stops:
        at = text.find(stop)
        if at != -1 and (best == -1 or at < best):
            best = at
    return best
