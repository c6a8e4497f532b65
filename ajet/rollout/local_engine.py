"""The in-process engine a config describes: `local_engine(cfg, model, tokenizer, ...)`.

`EngineRollout.local` runs its episodes on one. It lives apart from engine_rollout.py so that
building it imports no agent framework (the tuner imports AgentScope): `ajet episode` builds
it in a thread, packing the weights (seconds on a CPU), while it imports the workflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ajet.config.schema import AjetConfig, RolloutConfig
from ajet.engine.local import LocalEngine
from ajet.models.resolve import resolve_model_path

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


def local_engine(cfg: AjetConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *,
                 model_max_len: int, rollout: RolloutConfig | None = None, fixed_weights: bool = False) -> LocalEngine:
    """A `LocalEngine` of `model` with `rollout`'s settings (default `cfg.rollout`).
    `fixed_weights`: nothing will update the model (an evaluation)."""
    r = rollout or cfg.rollout
    return LocalEngine(model, tokenizer, max_batch_size=max(1, r.max_concurrency),
                       max_waiting=r.max_waiting_requests, max_model_len=model_max_len,
                       prefix_cache_tokens=r.prefix_cache_tokens, dtype=r.engine_dtype.value,
                       fixed_weights=fixed_weights, initial_model=initial_model_dir(cfg))


def initial_model_dir(cfg: AjetConfig) -> str | None:
    """The checkpoint directory default_model="initial" names (`model.initial_path`), or None
    for the weights the run starts from."""
    path = cfg.model.initial_path
    return str(resolve_model_path(path, cfg.model.cache_dir, key="model.initial_path")) if path else None
