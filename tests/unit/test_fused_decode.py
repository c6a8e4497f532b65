"""The written-out Llama decode step (ajet/engine/fused_decode.py): the engine decodes the same
tokens with the same logprobs as through the HF forward, sees weight updates, and keeps the HF
forward where the written-out step would compute something else."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tiny_models import load_peaky, tiny_llama

from ajet.engine.base import SamplingParams
from ajet.engine.fused_decode import LlamaDecodeStep
from ajet.engine.weights import has_bf16_gemm

# Same weights, same arithmetic in another order of calls: fp32 rounding only. fp16 and bf16
# engines run the same copy either way; bf16 rounds its activations to 8 bits, so its batched
# sums may round differently (a spacing of 0.06 at the peaky model's logits, see
# test_engine_weights.py).
TOLERANCE = {"float32": 1e-4, "float16": 1e-3, "bfloat16": 0.15, "bfloat16_linear": 1e-3}
BF16_GEMM = has_bf16_gemm()
needs_bf16_gemm = pytest.mark.skipif(not BF16_GEMM, reason="needs a CPU with avx512_bf16 or AMX")


@pytest.fixture
def peaky(tiny_model_dir):
    return load_peaky(tiny_model_dir, 1234, logit_scale=4.0)


def generate(peaky, dtype, fused, prompts, params, **engine_kwargs):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    with LocalEngine(model, tokenizer, max_batch_size=8, dtype=dtype, fused_decode=fused, **engine_kwargs) as engine:
        assert (engine._batch.fused is not None) == fused
        if fused:  # packed copies run q/k/v as one GEMM; the MLP's gate/up too, or a Bf16SwiGLU
            step = engine._batch.fused
            assert all((m is not None) == (dtype in ("float16", "bfloat16_linear")) for m in step.qkv)
            assert all((m is not None) == (dtype == "float16") for m in step.gate_up)
            swiglu = {type(layer.mlp).__name__ == "Bf16SwiGLU" for layer in step.layers}
            assert swiglu == {dtype == "bfloat16_linear"}

        async def run():
            return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

        results = [completion for (completion,) in asyncio.run(run())]
        steps = engine.stats["decode_steps"]
    return results, steps


def prompts_of(tokenizer, count):
    # Different lengths: the batch's rows are left-padded differently, so the mask is used.
    return [tokenizer.encode(f"Question {i}: " + "tell me more " * (i % 4 + 1)) for i in range(count)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", pytest.param(
    "bfloat16_linear", marks=needs_bf16_gemm)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fused_step_decodes_what_the_hf_forward_decodes(peaky, dtype, temperature):
    _, tokenizer = peaky
    prompts = prompts_of(tokenizer, 5)
    params = SamplingParams(temperature=temperature, max_tokens=12, seed=7)
    fused, fused_steps = generate(peaky, dtype, True, prompts, params)
    hf, hf_steps = generate(peaky, dtype, False, prompts, params)
    assert fused_steps == hf_steps > 0
    for a, b in zip(fused, hf, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < TOLERANCE[dtype]
    assert len({tuple(c.token_ids) for c in fused}) > 1  # not one repeated output: a vacuous test


def test_fused_step_sees_an_update_of_the_trainers_weights(peaky):
    """The fp32 engine decodes with the trainer's own tensors: an optimizer step in place must
    change the next request's tokens exactly as it changes the HF forward's."""
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    prompt = prompts_of(tokenizer, 1)[0]
    params = SamplingParams(temperature=0.0, max_tokens=10)
    with LocalEngine(model, tokenizer, max_batch_size=4) as engine:
        (before,) = asyncio.run(engine.generate(prompt, params))
        with engine.paused(), torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.down_proj.weight.mul_(-1.5)
                layer.self_attn.v_proj.weight.mul_(0.5)
            engine.bump_version()
        (after,) = asyncio.run(engine.generate(prompt, params))
    expected = []
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(10):
            logits = model(torch.tensor([ids])).logits[0, -1]
            expected.append(int(logits.argmax()))
            ids.append(expected[-1])
    assert after.token_ids == expected
    assert after.token_ids != before.token_ids


def tiny_qwen2(vocab_size: int):
    """A 2-layer random Qwen2 (Llama with biases on q/k/v), seeded, with large enough weights
    that its greedy output varies."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, tie_word_embeddings=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:  # weights and biases; the norms stay ones
                param.copy_(torch.randn_like(param) * (0.5 if param.dim() >= 2 else 0.2))
    return model.eval()


@pytest.mark.parametrize("dtype", ["float32", "float16", pytest.param(
    "bfloat16_linear", marks=needs_bf16_gemm)])
def test_qwen2_decodes_through_the_written_out_step_as_through_hf(peaky, dtype):
    _, tokenizer = peaky
    qwen = tiny_qwen2(len(tokenizer))
    assert any(layer.self_attn.q_proj.bias.abs().sum() > 0 for layer in qwen.model.layers)  # the biases count
    prompts = prompts_of(tokenizer, 4)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    fused, _ = generate((qwen, tokenizer), dtype, True, prompts, params)
    hf, _ = generate((qwen, tokenizer), dtype, False, prompts, params)
    for a, b in zip(fused, hf, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < TOLERANCE[dtype]
    assert len({tuple(c.token_ids) for c in fused}) > 1


def test_models_the_step_does_not_cover_keep_the_hf_forward(peaky):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from ajet.engine.weights import ServingWeights

    model, _ = peaky
    assert isinstance(LlamaDecodeStep.build(model), LlamaDecodeStep)
    assert isinstance(LlamaDecodeStep.build(ServingWeights(model, "float16").model), LlamaDecodeStep)
    # LoRA: peft's layers apply each row's adapter; the written-out step would skip them.
    lora = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert LlamaDecodeStep.build(lora) is None
    assert LlamaDecodeStep.build(lora.get_base_model()) is None  # LoRA layers injected in place
    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                           sliding_window=16, max_window_layers=0))
    assert "sliding_attention" in sliding.config.layer_types and LlamaDecodeStep.build(sliding) is None
    gelu = tiny_llama()
    gelu.config.hidden_act = "gelu"
    assert LlamaDecodeStep.build(gelu) is None
    dynamic = tiny_llama()
    dynamic.model.rotary_emb.rope_type = "dynamic"
    assert LlamaDecodeStep.build(dynamic) is None
