"""Helpers shared by the engine tests (a module, not a conftest: `conftest` is ambiguous
between tests/ and tutorial/ on sys.path)."""

from __future__ import annotations

from pathlib import Path


def load_peaky(model_dir: Path, seed: int = 1234):
    """The tiny model with larger random weights (seeded), so that its greedy output varies
    token to token (the default init repeats one token forever, which would make equality
    tests vacuous) and its samples vary; with its tokenizer. A fresh copy per call."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    model.eval()
    return model, AutoTokenizer.from_pretrained(model_dir)
