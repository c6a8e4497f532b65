"""The engine's lower-precision copy of the weights (`rollout.engine_dtype`): what it holds,
that it serves what a forward of the copy gives, and that it is never stale after an update."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import load_peaky

from ajet.engine.base import SamplingParams
from ajet.engine.weights import has_bf16_gemm

BF16_GEMM = has_bf16_gemm()
needs_bf16_gemm = pytest.mark.skipif(not BF16_GEMM, reason="bfloat16_linear needs a CPU with avx512_bf16 or AMX")
LOW = ("bfloat16", "float16", pytest.param("bfloat16_linear", marks=needs_bf16_gemm))
# How far the engine's logprobs may be from a plain forward of the same low-precision copy. The
# fp16 copy multiplies with fp32 accumulation (Fp16Linear): measured 3e-6. bf16 computes in bf16
# throughout (8 significant bits), so the engine's batched, KV-cached decode and one full forward
# round differently: measured 0.009 at the tiny model's first weights and 0.064 once they are
# scaled by 1.5 (logits up to ~16 in size; bf16's spacing there is 0.06). Stale weights give
# 2.5-3.2 in the same test, so either bound still tells fresh from stale.
# bfloat16_linear rounds the activations to bf16 at each GEMM only, with fp32 accumulation and
# fp32 elsewhere: like fp16, the engine and a full forward of the copy round alike.
LIKE_WITH_LIKE = {"float16": 0.05, "bfloat16": 0.15, "bfloat16_linear": 0.05}


@pytest.fixture
def peaky(tiny_model_dir):
    """A fresh tiny model per test (tests change its weights), with larger random weights so
    greedy output varies token to token."""
    return load_peaky(tiny_model_dir, 1234)


def make_engine(peaky, dtype, **kwargs):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    return LocalEngine(model, tokenizer, max_batch_size=8, dtype=dtype, **kwargs)


def logprobs_of(model, prompt, completion, temperature=1.0):
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, tok]) for i, tok in enumerate(completion)]


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


# Each packed linear against the fp32 layer: (class, (lower, upper) bound of the error, bound
# after repacking), relative to the output's size. bf16 keeps 8 significant bits: errors of
# ~1e-2 of the output's size, not fp32's 1e-7 (hence a lower bound too); fp16 keeps 11.
PACKED = [
    pytest.param("Fp16Linear", (None, 1e-3), 2e-3, id="fp16"),
    pytest.param("Bf16Linear", (1e-6, 3e-2), 3e-2, id="bf16", marks=needs_bf16_gemm),
]


@pytest.mark.parametrize(("cls", "bounds", "repacked"), PACKED)
def test_packed_linear_matches_fp32_linear_and_is_stale_until_packed(cls, bounds, repacked):
    import ajet.engine.weights as weights

    layer = torch.nn.Linear(64, 96)
    x = torch.randn(3, 5, 64)
    fast = getattr(weights, cls)(layer)
    lower, upper = bounds
    with torch.no_grad():
        expected = layer(x)
        got = fast(x)
        assert got.shape == expected.shape and got.dtype == torch.float32
        error = (got - expected).abs().max()
        assert error < upper * expected.abs().max()
        if lower is not None:
            assert lower * expected.abs().max() < error
        layer.weight.mul_(2.0)  # the copy is stale until packed again
        assert (fast(x) - layer(x)).abs().max() > 0.1
        fast.pack()
        assert (fast(x) - layer(x)).abs().max() < repacked * layer(x).abs().max()


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16_linear", marks=needs_bf16_gemm)])
def test_merged_layers_give_their_outputs_side_by_side_and_are_refreshed_with_the_copy(peaky, dtype):
    from ajet.engine.weights import ServingWeights

    model, _ = peaky
    weights = ServingWeights(model, dtype)
    attn = weights.model.model.layers[0].self_attn
    before = weights.copy_bytes()
    qkv = weights.merged(attn.q_proj, attn.k_proj, attn.v_proj)
    assert qkv is not None and weights.merged(attn.q_proj, attn.k_proj, attn.v_proj) is qkv  # made once
    assert qkv.out_features == sum(m.out_features for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    # The merged layer holds what its members held: they free theirs and read its output.
    assert weights.copy_bytes() == before
    assert all(m.packed is None for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    x = torch.randn(4, attn.q_proj.in_features)
    trainer = model.model.layers[0].self_attn

    def fp32():  # the trainer's own layers
        return torch.cat([trainer.q_proj(x), trainer.k_proj(x), trainer.v_proj(x)], dim=-1)

    def apart():  # the copy's layers, called as the HF forward calls them
        return torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)

    with torch.no_grad():
        assert (qkv(x) - fp32()).abs().max() <= 1e-2 * fp32().abs().max()  # the same rows, in order
        assert torch.equal(apart(), qkv(x))
        model.model.layers[0].self_attn.k_proj.weight.mul_(-2.0)  # the trainer's update
        weights.refresh(1)
        assert (qkv(x) - fp32()).abs().max() <= 1e-2 * fp32().abs().max()  # repacked too
        assert torch.equal(apart(), qkv(x))
        # A member called on another input than the one before it computes for that input.
        y = torch.randn(2, attn.q_proj.in_features)
        q, k = attn.q_proj.out_features, attn.k_proj.out_features
        attn.q_proj(x)
        assert torch.equal(attn.k_proj(y), qkv(y)[:, q : q + k])
    # Only packed layers merge: the fp32 engine forwards the trainer's own layers.
    fp32 = ServingWeights(model, "float32")
    plain = fp32.model.model.layers[0].self_attn
    assert fp32.merged(plain.q_proj, plain.k_proj) is None
    assert weights.merged(attn.q_proj, plain.k_proj) is None


def test_layers_packed_on_several_threads_equal_layers_packed_one_by_one(peaky):
    """`pack_all` packs `Fp16Linear`s on torch's threads at once: the same packed weights, and
    `merged_groups` packs every new group in one call, each made once."""
    from ajet.engine.weights import Fp16Linear, ServingWeights, pack_all

    layers = [torch.nn.Linear(64, 32 * (i + 1)) for i in range(6)]
    one_by_one = [Fp16Linear(layer) for layer in layers]
    together = [Fp16Linear(layer, pack=False) for layer in layers]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pack_all(together)
    finally:
        torch.set_num_threads(threads)
    x = torch.randn(3, 64)
    with torch.no_grad():
        for a, b in zip(one_by_one, together, strict=True):
            assert torch.equal(a(x), b(x))

    model, _ = peaky
    weights = ServingWeights(model, "float16")
    attns = [layer.self_attn for layer in weights.model.model.layers]
    groups = [(a.q_proj, a.k_proj, a.v_proj) for a in attns]
    merged = weights.merged_groups(groups + groups[:1])
    assert len(merged) == len(groups) + 1 and merged[-1] is merged[0]
    assert all(m is not None for m in merged) and len({id(m) for m in merged}) == len(groups)
    assert weights.merged(*groups[1]) is merged[1]


@needs_bf16_gemm
def test_a_bf16_copys_mlp_rounds_once_and_no_worse_than_its_layers(peaky):
    """`Bf16SwiGLU` (the SiLU and the product inside oneDNN's GEMMs) against the fp32 MLP: as
    close as the packed layers one by one, which round the gate and up outputs first; and a
    bfloat16_linear copy's Llama MLPs are Bf16SwiGLUs, refreshed with the copy."""
    from ajet.engine.weights import Bf16Linear, Bf16SwiGLU, ServingWeights

    model, _ = peaky
    weights = ServingWeights(model, "bfloat16_linear")
    layer = weights.model.model.layers[0]
    assert all(type(layer.mlp) is Bf16SwiGLU for layer in weights.model.model.layers)
    assert type(layer.mlp.gate_proj) is Bf16Linear
    fp32 = model.model.layers[0].mlp
    x = torch.randn(2, 8, fp32.gate_proj.in_features)
    with torch.no_grad():
        for _ in range(2):
            exact = fp32(x)
            fused = layer.mlp(x)
            apart = layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x))
            assert fused.dtype == torch.float32 and fused.shape == exact.shape
            error, apart_error = (fused - exact).abs().mean(), (apart - exact).abs().mean()
            assert 0 < error <= 1.1 * apart_error  # bf16's rounding, not more
            fp32.up_proj.weight.mul_(-1.5)  # the trainer's update, then the copy's refresh
            weights.refresh(weights.version + 1)


def test_layers_that_read_different_inputs_are_not_merged():
    from ajet.engine.weights import Fp16Linear

    with pytest.raises(ValueError, match="same input width"):
        Fp16Linear(torch.nn.Linear(8, 4), torch.nn.Linear(16, 4))
    with pytest.raises(ValueError, match="a bias or none"):
        Fp16Linear(torch.nn.Linear(8, 4), torch.nn.Linear(8, 4, bias=False))


def test_bf16_linear_is_refused_where_bf16_gemms_are_emulated(peaky, monkeypatch):
    from ajet.engine.weights import ServingWeights

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match="avx512_bf16 or AMX.*use float16"):
        ServingWeights(peaky[0], "bfloat16_linear")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with pytest.raises(ValueError, match="built with oneDNN.*use float16"):
        ServingWeights(peaky[0], "bfloat16_linear")


def test_auto_picks_the_fastest_copy_the_machine_has(peaky, monkeypatch):
    from ajet.engine import weights
    from ajet.engine.weights import ServingWeights, fastest_engine_dtype

    cpu = torch.device("cpu")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert fastest_engine_dtype(cpu) == "bfloat16_linear"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # oneDNN kept below AMX
    assert fastest_engine_dtype(cpu) == "float16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    assert fastest_engine_dtype(cpu) == "bfloat16_linear"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)  # avx512_bf16 or AVX2 only
    assert fastest_engine_dtype(cpu) == "float16"
    monkeypatch.setattr(weights, "has_fbgemm", lambda: False)  # no FBGEMM (ARM)
    assert fastest_engine_dtype(cpu) == "float32"
    assert fastest_engine_dtype(torch.device("cuda", 0)) == "bfloat16"
    assert ServingWeights(peaky[0], "auto").dtype == "float32"  # and it builds what it picked
    monkeypatch.undo()
    picked = ServingWeights(peaky[0], "auto")
    assert picked.dtype == fastest_engine_dtype(cpu) and picked.is_copy == (picked.dtype != "float32")


def test_copies_hold_the_precision_and_leave_the_trainer_alone(peaky):
    from ajet.engine.weights import Fp16Linear, ServingWeights

    model, _ = peaky
    model.requires_grad_(True)
    trainer_params = {id(p) for p in model.parameters()}
    bf16 = ServingWeights(model, "bfloat16")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert not trainer_params & {id(p) for p in bf16.model.parameters()}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the master weights
    fp16 = ServingWeights(model, "float16")
    linears = [m for m in fp16.model.modules() if isinstance(m, Fp16Linear)]
    # 7 projections per layer x 2 layers + the (tied) lm_head; no nn.Linear is left.
    assert len(linears) == 15 and not any(type(m) is torch.nn.Linear for m in fp16.model.modules())
    # Embeddings and norms are the trainer's own tensors (always fresh, no copy).
    assert fp16.model.get_input_embeddings().weight is model.get_input_embeddings().weight
    assert ServingWeights(model, "float32").model is model
    if BF16_GEMM:
        from ajet.engine.weights import Bf16Linear

        bf16_linear = ServingWeights(model, "bfloat16_linear")
        assert len([m for m in bf16_linear.model.modules() if isinstance(m, Bf16Linear)]) == 15
        assert bf16_linear.model.get_input_embeddings().weight is model.get_input_embeddings().weight
        assert bf16_linear.copy_bytes() == fp16.copy_bytes()  # 2 bytes a weight either way
    assert all(p.requires_grad for p in model.parameters())  # the trainer still trains them all
    assert 0 < fp16.copy_bytes() and 0 < bf16.copy_bytes()
    with pytest.raises(ValueError, match="unknown"):
        ServingWeights(model, "int4")


@pytest.mark.parametrize("dtype", LOW)
def test_engine_serves_what_a_forward_of_its_copy_gives(peaky, dtype):
    model, tokenizer = peaky
    prompts = [tokenizer.encode(f"Question {i}: " + "tell me more " * (i + 1)) for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    with make_engine(peaky, dtype) as engine:
        assert engine.dtype == dtype

        async def run():
            return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

        results = asyncio.run(run())
        served = engine._weights.model
    for prompt, (completion,) in zip(prompts, results, strict=True):
        # Like with like: the batched engine and a plain forward of the same copy.
        assert max_diff(completion.logprobs, logprobs_of(served, prompt, completion.token_ids)) < 0.05
        # And close to the trainer's fp32 weights (the mismatch the RL update logs).
        assert max_diff(completion.logprobs, logprobs_of(model, prompt, completion.token_ids)) < 0.3


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("update", ["in_place", "load_state_dict", "updating_weights"])
def test_a_weight_update_refreshes_the_copy_before_the_next_request(peaky, dtype, update):
    model, tokenizer = peaky
    prompt = tokenizer.encode("A prompt long enough to be worth caching, about some topic.")
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    with make_engine(peaky, dtype, prefix_cache_tokens=4096) as engine:
        (before,) = asyncio.run(engine.generate(prompt, params))
        old = {k: v.clone() for k, v in model.state_dict().items()}
        new = {k: v * 1.5 if v.dim() >= 2 else v for k, v in old.items()}
        if update == "in_place":
            with engine.paused():  # as the trainer's optimizer step
                model.load_state_dict(new)
                engine.bump_version()
        elif update == "updating_weights":  # the trainers' sequence: it frees a packed copy meanwhile
            from ajet.training.step import updating_weights

            with updating_weights(engine):
                packed = engine._weights._packed
                assert all(layer.packed is None for layer in packed)  # float16 / bfloat16_linear
                model.load_state_dict(new)
        else:
            engine.load_state_dict(new)
        (after,) = asyncio.run(engine.generate(prompt, params))
        assert after.policy_version == 1
    stale = logprobs_of(_copy_with(model, old, dtype), prompt, after.token_ids)
    fresh = logprobs_of(_copy_with(model, new, dtype), prompt, after.token_ids)
    assert max_diff(after.logprobs, fresh) < LIKE_WITH_LIKE[dtype]
    assert max_diff(after.logprobs, stale) > 0.5  # the old weights would give other logprobs
    before_ref = logprobs_of(_copy_with(model, old, dtype), prompt, before.token_ids)
    assert max_diff(before.logprobs, before_ref) < LIKE_WITH_LIKE[dtype]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16",
                                   pytest.param("bfloat16_linear", marks=needs_bf16_gemm)])
def test_a_dropped_copy_is_packed_again_at_the_next_request_with_the_same_output(peaky, dtype):
    """`drop_weight_copy` (each in-process update) frees a packed copy; the next request packs it
    again from the trainer's weights, whether or not they changed, and serves what it served."""
    model, tokenizer = peaky
    prompt = tokenizer.encode("Question: tell me more about it")
    params = SamplingParams(temperature=0.0, max_tokens=8)
    with make_engine(peaky, dtype) as engine:
        (before,) = asyncio.run(engine.generate(prompt, params))
        freed = engine.drop_weight_copy()
        packed = engine._weights._packed
        if dtype in ("float16", "bfloat16_linear"):
            assert freed >= engine._weights.copy_bytes() // 2 > 0
            assert packed and all(layer.packed is None for layer in packed)
        else:  # nothing packed: float32 is the trainer's model, a bfloat16 copy is refreshed in place
            assert freed == 0 and not packed
        (after,) = asyncio.run(engine.generate(prompt, params))
        assert all(layer.packed is not None for layer in packed)
        assert after.policy_version == before.policy_version == 0
    assert after.token_ids == before.token_ids
    assert max_diff(after.logprobs, before.logprobs) < 1e-5


def _copy_with(model, state, dtype):
    """A fresh copy of `model` in `dtype` with `state` loaded (the trainer's model unchanged)."""
    import copy

    from ajet.engine.weights import ServingWeights

    clone = copy.deepcopy(model)
    clone.load_state_dict(state)
    return ServingWeights(clone, dtype).model


def test_bf16_prefix_cache_holds_bf16_kv_and_matches_cache_off(peaky):
    model, tokenizer = peaky
    system = tokenizer.encode("System: you are a careful agent with a calculator tool. " * 3)
    prompts = [system + tokenizer.encode(f"Task {t}: add {t} and {t + 1}.") for t in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=6)

    def turns(engine):
        out = []
        for prompt in prompts + prompts:  # the second round hits the cache
            (completion,) = asyncio.run(engine.generate(prompt, params))
            out.append(completion)
        return out

    with make_engine(peaky, "bfloat16") as off:
        expected = turns(off)
    with make_engine(peaky, "bfloat16", prefix_cache_tokens=4096) as on:
        got = turns(on)
        assert on.take_metrics()["engine/cache_hit_rate"] > 0.4
        cached = on._reuse.cache
        assert cached is not None and cached.tokens > 0
        match = cached.match(prompts[0])
        assert match.length > 0 and {seg.dtype for seg in match.segments} == {torch.bfloat16}
        match.release()
    for a, b in zip(expected, got, strict=True):
        assert a.token_ids == b.token_ids
        # bf16 rounding differs between a full prefill and a cached prefix + suffix.
        assert max_diff(a.logprobs, b.logprobs) < 0.05


# In a fresh interpreter: the OS threads before and after building each lower-precision copy in
# the main thread (casting and oneDNN's reorder run OpenMP parallel regions; a pool left in the
# main thread would throttle the engine thread's decode steps, ajet/own_thread.py).
_COPY_THREADS = """
import os, sys, time, torch
from tiny_models import load_peaky
from ajet.engine.weights import ServingWeights
from ajet.own_thread import in_own_thread
torch.set_num_threads(2)
count = lambda: len(os.listdir("/proc/self/task"))
model, _ = in_own_thread(load_peaky, sys.argv[1])
def settled():  # its own thread's pool exits just after the thread does
    seen = [count()]
    while len(seen) < 100 and (len(seen) < 5 or len(set(seen[-5:])) > 1):
        time.sleep(0.05)
        seen.append(count())
    return seen[-1]
before = settled()
copies = [ServingWeights(model, d) for d in sys.argv[2:]]
after = settled()
x = torch.randn(512, 512)
[x @ x for _ in range(20)]  # the same process can leave a pool in the main thread: the count can rise
print(before, after, count())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_copies_are_built_without_leaving_an_openmp_pool_in_the_callers_thread(tiny_model_dir):
    dtypes = ["bfloat16", "float16"] + (["bfloat16_linear"] if BF16_GEMM else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    out = subprocess.run([sys.executable, "-c", _COPY_THREADS, str(tiny_model_dir), *dtypes], capture_output=True,
                         text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, direct = (int(v) for v in out.stdout.split())
    assert after == before
    assert direct > before  # the count does see a pool left in the main thread
