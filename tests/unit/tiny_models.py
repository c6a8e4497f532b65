"""Helpers shared by the engine and context tests (a module, not a conftest: `conftest` is ambiguous
between tests/ and tutorial/ on sys.path)."""

from __future__ import annotations

from pathlib import Path


def load_peaky(model_dir: Path, seed: int = 1234, logit_scale: float = 1.0):
    """The tiny model with larger random weights (seeded), so that its greedy output varies
    token to token (the default init repeats one token forever, which would make equality
    tests vacuous) and its samples vary; with its tokenizer. A fresh copy per call.

    Its next-token distribution is nearly flat over the 49k vocabulary (logprobs around -10).
    `logit_scale` multiplies the final norm's weight, hence every logit: a few tokens then
    hold most of the mass. Tests that compare *sampled* tokens across two computations need
    that: an inverse-CDF draw over a flat distribution moves to the neighbouring token id when
    a probability changes by float noise (1e-6)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        model.model.norm.weight.mul_(logit_scale)
    model.eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def tiny_llama(attn: str = "sdpa"):
    """A 2-layer random Llama (vocab 64, seeded) with the given attention implementation,
    in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()
