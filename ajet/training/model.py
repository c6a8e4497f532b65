"""The model a recipe trains: loaded from `model.path`, with LoRA when enabled, and saved at the end.

Full fine-tuning or a peft LoRA adapter from `model.lora` (peft is imported only when LoRA
is on). The final model is a plain Hugging Face checkpoint, written atomically.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from ajet.config.schema import ModelConfig
from ajet.models.load import load_model_and_tokenizer

log = logging.getLogger(__name__)


def load_trainable_model(cfg: ModelConfig, *, seed: int, gradient_checkpointing: bool = False) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer); a peft model when `cfg.lora.enabled`."""
    import torch

    torch.manual_seed(seed)
    model, tokenizer = load_model_and_tokenizer(cfg)
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model  # LoRA runs only

        lora = cfg.lora
        model = get_peft_model(model, LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
        ))
        model.eval()
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model, tokenizer


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each decoder layer in backward (`trainer.gradient_checkpointing`).

    Non-reentrant checkpointing: it works whether or not the inputs need grad (LoRA freezes the
    embeddings) and is what torch recommends. The model recomputes only in train mode: the
    engine's eval-mode decoding is unchanged."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def model_window(model: Any, configured: int) -> int:
    return configured or int(getattr(model.config, "max_position_embeddings", 0) or 4096)


def save_final_model(model: Any, tokenizer: Any, out: Path, *, lora: bool) -> Path:
    """A plain Hugging Face checkpoint (a LoRA adapter is merged into a copy first), written
    atomically: into a temporary directory beside `out`, then renamed, so a kill mid-write
    never leaves a half `final_model/` (an earlier one is replaced only once the new one is whole)."""
    import shutil
    import tempfile

    if lora:
        model = copy.deepcopy(model).merge_and_unload()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            old = out.with_name(f".old-{out.name}")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("final model saved to %s", out)
    return out
