"""A hand-written decode step for Llama-architecture models, Qwen2 too (engine thread only).

A decode step forwards one token per row. Through transformers' modules that is hundreds of
small calls per step (module dispatch, the rotary module, the attention interface, the cache's
`update`, mask handling) around the 211 GEMMs that are the real work (7 a layer, 30 layers,
the lm_head). On the bundled model at 16 rows and 128 columns of KV (Intel AMX machine, 2
threads, fp16 weights) the HF forward took 95-99 ms, the same arithmetic written out here
74-81 ms. `LlamaDecodeStep` runs that arithmetic directly on the model's own modules' weights:

    x = embed(token); per layer: x += o(attn(rope(q(n1(x))), rope(k(...)), v(...)));
                                 x += down(silu(gate(n2(x))) * up(n2(x)));
    logits = lm_head(norm(x))

It reads every weight from the modules at each call, so it never holds a copy and never goes
stale: fp32 `nn.Linear`s (the trainer's own weights), `Fp16Linear`s and `Bf16Linear`s
(engine_dtype float16 / bfloat16_linear, repacked in place by `ServingWeights.refresh`) and a
bf16 copy all work unchanged. Under float16 and bfloat16_linear it runs a layer's q/k/v as one
GEMM (gate/up too under float16), packed by `ServingWeights.merged_groups` and refreshed with the copy;
a bfloat16_linear copy's MLP is a `Bf16SwiGLU` (SiLU and product inside the GEMMs). The KV goes
straight into `BatchKV`'s buffers; the mask is `BatchKV.prepare_step`'s.

It applies only where it computes exactly what the HF forward computes (`LlamaDecodeStep.build`
returns None otherwise and the engine keeps the HF forward): a plain `LlamaForCausalLM` or
`Qwen2ForCausalLM` without sliding-window layers (no peft wrapper: LoRA adapters and
mixed-adapter batches go through peft's layers), a SiLU MLP, a RoPE whose frequencies do not
change with the length, on the CPU. Tests compare its tokens and logprobs with the HF
forward's (tests/unit/test_fused_decode.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch  # this module is imported only where the engine runs (like kv.py, prefill.py)
import torch.nn.functional as F

from ajet.engine.weights import Bf16Linear, Bf16SwiGLU, Fp16Linear

if TYPE_CHECKING:  # pragma: no cover
    from ajet.engine.kv import BatchKV

log = logging.getLogger(__name__)

# `ServingWeights.merged_groups`: groups of modules -> one packed module (or None) per group
Merge = Callable[[Sequence[Sequence[Any]]], list[Any]]

# Model classes whose decode step is the one written out here, with their config's model_type.
# Qwen2 is Llama with biases on q/k/v (`_linear` adds them) and optional sliding-window layers
# (refused in `_unsupported`).
_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def _linear(module: Any, x: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """`module(x)` without the module call's hook machinery: an `nn.Linear`'s weight (read now,
    so an update in place is seen), or the module's own forward (e.g. `Fp16Linear`).
    `exact=False`: a `Bf16Linear` may return its bf16 output as it is, for a caller whose next
    op mixes it with fp32 (an add, the rotation), which then computes in fp32 all the same."""
    if type(module) is torch.nn.Linear:
        return F.linear(x, module.weight, module.bias)
    if not exact and type(module) is Bf16Linear:
        return module.forward_bf16(x)
    return module.forward(x)


def _gemm_input(module: Any, h: torch.Tensor) -> torch.Tensor:
    """`h` as the module multiplies it: a `Bf16Linear` rounds its input to bf16, so round it
    once for the two or three projections that share it (each then finds it rounded)."""
    return h.to(torch.bfloat16) if type(module) is Bf16Linear else h


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: the variance in fp32, the product in the activations' dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class LlamaDecodeStep:
    """One decode step of a `LlamaForCausalLM`, written out (see the module docstring)."""

    def __init__(self, model: Any, merged: Merge | None = None) -> None:
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.layers = list(model.model.layers)
        rotary = model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.float()
        self.rope_scale = float(rotary.attention_scaling)
        self.scaling = self.layers[0].self_attn.scaling
        # Per layer, q/k/v as one GEMM where `merged` packs them (float16 and bfloat16_linear
        # copies), else None: the step then runs the modules one by one. A bfloat16_linear
        # copy's MLP is a `Bf16SwiGLU` (three fused oneDNN calls); other MLPs run gate and up
        # as one GEMM where `merged` packs them. All are packed in one call (on every core).
        merge = merged or (lambda groups: [None] * len(groups))
        qkv: list[tuple[Any, ...]] = [(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
                                      for layer in self.layers]
        gate_up: list[tuple[Any, ...]] = [(layer.mlp.gate_proj, layer.mlp.up_proj) for layer in self.layers
                                          if type(layer.mlp) is not Bf16SwiGLU]
        packed = iter(merge(qkv + gate_up))
        self.qkv = [next(packed) for _ in qkv]
        self.gate_up = [None if type(layer.mlp) is Bf16SwiGLU else next(packed) for layer in self.layers]

    @classmethod
    def build(cls, model: Any, merged: Merge | None = None) -> LlamaDecodeStep | None:
        """The step for `model`, or None (with the reason at debug level) where it would not
        compute what the HF forward computes. `merged` (`ServingWeights.merged_groups`) packs layers
        that read the same input into one."""
        reason = cls._unsupported(model)
        if reason:
            log.debug("decode steps go through the HF forward: %s", reason)
            return None
        return cls(model, merged)

    @staticmethod
    def _unsupported(model: Any) -> str:
        if _ARCHITECTURES.get(type(model).__name__) != getattr(model.config, "model_type", ""):
            return f"{type(model).__name__} is not one of {sorted(_ARCHITECTURES)} (without a peft wrapper)"
        config = model.config
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            return "sliding-window layers"
        if config.hidden_act != "silu":
            return f"hidden_act={config.hidden_act}"
        if getattr(config, "pretraining_tp", 1) != 1:
            return f"pretraining_tp={config.pretraining_tp}"
        linears = [model.lm_head] + [
            module for layer in model.model.layers
            for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                           layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
        ]
        odd = {type(m).__name__ for m in linears if type(m) not in (torch.nn.Linear, Fp16Linear, Bf16Linear)}
        if odd:  # e.g. peft's LoRA layers injected in place: their adapters need peft's forward
            return f"linear layers of type {sorted(odd)}"
        rope_type = str(getattr(model.model.rotary_emb, "rope_type", "default"))
        if "dynamic" in rope_type or rope_type == "longrope":
            return f"rope_type={rope_type} changes with the length"
        if model.get_input_embeddings().weight.device.type != "cpu":
            return "the model is not on the CPU"
        return ""

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None,
                 kv: BatchKV) -> torch.Tensor:
        """Logits ([rows, vocab]) for `input_ids` ([rows]) at `position_ids` ([rows]); writes
        their keys and values at column `kv.length` (the caller then calls `kv.advance()`)."""
        model = self.model
        x = model.model.embed_tokens.weight[input_ids]
        rows, dtype = x.shape[0], x.dtype
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        freqs = position_ids[:, None].float() * self.inv_freq[None, :]
        cos = (freqs.cos() * self.rope_scale).to(dtype)[:, None, :]  # [rows, 1, dim / 2]
        sin = (freqs.sin() * self.rope_scale).to(dtype)[:, None, :]
        col = kv.length
        for index, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = _gemm_input(attn.q_proj, _rms_norm(x, layer.input_layernorm.weight, self.eps))
            qkv = self.qkv[index]
            if qkv is not None:  # q, k and v side by side: one rotation for q and k
                out = _linear(qkv, h, exact=False).view(rows, heads + 2 * kv_heads, dim)
                qk, v = _rope(out[:, : heads + kv_heads], cos, sin), out[:, heads + kv_heads:]
            else:
                q = _linear(attn.q_proj, h).view(rows, heads, dim)
                k = _linear(attn.k_proj, h).view(rows, kv_heads, dim)
                qk = _rope(torch.cat((q, k), dim=1), cos, sin)  # one rotation for both
                v = _linear(attn.v_proj, h).view(rows, kv_heads, dim)
            keys, values = kv.keys[index], kv.values[index]
            keys[:rows, :, col] = qk[:, heads:]
            values[:rows, :, col] = v
            # The query heads that share a KV head attend as that head's queries: one pass over
            # each KV head's keys (enable_gqa's kernel reads them once per query head; ~25 %
            # slower at 16 rows). The mask is the same for every query of a row.
            o = F.scaled_dot_product_attention(
                qk[:, :heads].reshape(rows, kv_heads, heads // kv_heads, dim),
                keys[:rows, :, : col + 1], values[:rows, :, : col + 1], attn_mask=mask, scale=self.scaling,
            )
            x = x + _linear(attn.o_proj, o.reshape(rows, heads * dim), exact=False)
            h = _gemm_input(mlp.gate_proj, _rms_norm(x, layer.post_attention_layernorm.weight, self.eps))
            if type(mlp) is Bf16SwiGLU:
                x = x + mlp.forward_bf16(h)  # fp32 + bf16: an fp32 sum
                continue
            gate_up = self.gate_up[index]
            if gate_up is not None:
                gate, up = gate_up(h).chunk(2, dim=-1)
            else:
                gate, up = _linear(mlp.gate_proj, h), _linear(mlp.up_proj, h)
            x = x + _linear(mlp.down_proj, F.silu(gate) * up, exact=False)
        x = _rms_norm(x, model.model.norm.weight, self.eps)
        return _linear(model.lm_head, x).float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` ([rows, heads, dim]) as transformers' `apply_rotary_pos_emb`:
    x * cos + rotate_half(x) * sin, with cos and sin given for one half (the halves repeat)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

