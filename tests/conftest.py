"""Shared fixtures: the bundled model and a tiny random model with the same tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests run with the library's defaults but never touch the user's real cache.
os.environ.setdefault("AJET_CACHE_DIR", str(Path.home() / ".cache" / "ajet"))


@pytest.fixture(scope="session")
def bundled_model_dir() -> Path:
    """The converted bundled SmolLM2-135M-Instruct checkpoint (converted once, cached)."""
    from ajet.models.resolve import bundled_checkpoint

    return bundled_checkpoint()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path) -> Path:
    """A 2-layer random Llama with the bundled tokenizer and chat template (fast, deterministic)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny_model")
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
