"""Load a causal LM and its tokenizer from the configured path."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ajet.config.schema import ModelConfig
from ajet.models.resolve import resolve_model_path

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_tokenizer(cfg: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.path, cfg.cache_dir))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_and_tokenizer(cfg: ModelConfig) -> tuple[Any, Any]:
    """Return (model in eval mode on the configured device, tokenizer)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(cfg.path, cfg.cache_dir)
    device = pick_device(cfg.device)
    start = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(cfg.dtype, device))
    model.to(device)
    model.eval()
    tokenizer = load_tokenizer(cfg)
    log.info("loaded %s on %s in %.2f s", path, device, time.monotonic() - start)
    return model, tokenizer
