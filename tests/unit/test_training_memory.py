"""The memory levers of an update are exact: chunked LM-head log-probs, gradient checkpointing
with and without its kept matmuls (same loss and gradients as the plain path within 1e-5; what
the recompute skips, counted); the engine frees its prefix cache on
request; freed heap memory goes back to the OS."""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ajet.config.schema import LossAgg
from ajet.context.loss_weights import loss_weights
from ajet.context.pack import pack_samples
from ajet.context.types import Sample
from ajet.forward.logprobs import token_logprobs
from ajet.forward.packed import forward_packed


def tiny_llama(tie: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=tie)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def tree_batch():
    """Four samples sharing prefixes (one tree) and one on its own: a 4-D-masked packed sequence."""
    seqs = [[5, 6, 7, 8, 9, 10, 11, 40, 41], [5, 6, 7, 8, 12, 13, 50], [5, 6, 7, 8, 9, 14, 15, 16],
            [5, 6, 7, 30, 31, 32, 33, 34, 35, 36], [20, 21, 22, 23, 24]]
    samples = [Sample(input_ids=ids, loss_mask=[0] * 3 + [1] * (len(ids) - 3), old_logprobs=[0.0] * len(ids),
                      advantage=[0.5 - i * 0.3] * len(ids), episode_id=f"e{i}") for i, ids in enumerate(seqs)]
    (packed,) = pack_samples(samples, loss_weights(samples, LossAgg.token_mean), 1000)
    assert len(set(packed.parents)) > 1 and packed.num_entries > 8
    return packed


def loss_and_grads(model, packed, **kwargs):
    """A loss that uses both log-probs and entropies; its value and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    model.train()
    logp, entropy = forward_packed(model, packed, with_entropy=True, temperature=0.7, **kwargs)
    weights = torch.linspace(-1.0, 1.0, logp.numel())
    loss = -(weights * logp).sum() - 0.1 * entropy.sum()
    loss.backward()
    model.eval()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_token_logprobs_in_chunks_equal_all_at_once(chunk):
    torch.manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=True)
    hidden = torch.randn(23, 16, requires_grad=True)
    tokens = torch.randint(0, 50, (23,))
    out = {}
    for size in (0, chunk):
        hidden.grad, head.weight.grad, head.bias.grad = None, None, None
        logp, entropy = token_logprobs(hidden, head, tokens, temperature=0.8, chunk_size=size, with_entropy=True)
        ((logp * torch.linspace(-1.0, 1.0, 23)).sum() + 0.1 * entropy.sum()).backward()
        out[size] = (logp.detach(), entropy.detach(), hidden.grad.clone(), head.weight.grad.clone(),
                     head.bias.grad.clone())
    for full, chunked in zip(out[0], out[chunk], strict=True):
        torch.testing.assert_close(chunked, full, atol=1e-5, rtol=0)
    # The unchunked path is the plain log-softmax of the head's logits.
    expected = torch.log_softmax(head(hidden.detach()) / 0.8, -1).gather(-1, tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(out[0][0], expected, atol=1e-6, rtol=0)


def test_token_logprobs_without_grad_or_entropy():
    head = torch.nn.Linear(8, 20, bias=False)
    hidden, tokens = torch.randn(9, 8), torch.randint(0, 20, (9,))
    with torch.no_grad():
        full, none = token_logprobs(hidden, head, tokens, chunk_size=0)
        chunked, none_too = token_logprobs(hidden, head, tokens, chunk_size=2)
    assert none is None and none_too is None and not chunked.requires_grad
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=0)


@pytest.mark.parametrize("tie", [True, False])
def test_forward_packed_with_logits_chunk_same_loss_and_gradients(tie):
    model, packed = tiny_llama(tie), tree_batch()
    logp, entropy, grads = loss_and_grads(model, packed)
    logp_c, entropy_c, grads_c = loss_and_grads(model, packed, logits_chunk=3)
    torch.testing.assert_close(logp_c, logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_c, entropy, atol=1e-5, rtol=0)
    assert grads.keys() == grads_c.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("keep_matmuls", [False, True])
def test_gradient_checkpointing_same_loss_and_gradients(keep_matmuls):
    from ajet.training.model import enable_activation_checkpointing

    model, packed = tiny_llama(), tree_batch()
    logp, entropy, grads = loss_and_grads(model, packed, logits_chunk=4)
    enable_activation_checkpointing(model, keep_matmuls=keep_matmuls)
    assert model.is_activation_checkpointing
    logp_gc, entropy_gc, grads_gc = loss_and_grads(model, packed, logits_chunk=4)
    torch.testing.assert_close(logp_gc, logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_gc, entropy, atol=1e-5, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_gc[name], grad, atol=1e-5, rtol=0, msg=name)


class CountKernels(TorchDispatchMode):
    """The GEMMs (aten.mm, aten.addmm) and the attention kernels run while it is entered."""

    def __init__(self):
        super().__init__()
        self.matmuls = self.attention = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.matmuls += 1
        elif "scaled_dot_product" in str(func) and "backward" not in str(func):
            self.attention += 1
        return func(*args, **(kwargs or {}))


def backward_kernels(model, packed, *, bf16=False):
    """(GEMMs, attention forwards) run by one backward of the packed forward: the recompute's
    and the gradients'."""
    model.zero_grad(set_to_none=True)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = forward_packed(model, packed, logits_chunk=0)
    with CountKernels() as counted:
        logp.float().sum().backward()
    model.eval()
    return counted.matmuls, counted.attention


@pytest.mark.parametrize("bf16", [False, True])
def test_kept_matmuls_and_attention_are_not_recomputed(bf16):
    """trainer.checkpoint_keep_matmuls: the recompute in backward skips the six projections that
    read a layer's hidden state (q, k, v, o, gate, up) and the attention's forward, in fp32; under
    bf16 autocast it keeps nothing."""
    from ajet.training.model import enable_activation_checkpointing

    packed = tree_batch()
    counts = {}
    for keep in (False, True):
        model = tiny_llama()
        enable_activation_checkpointing(model, keep_matmuls=keep)
        counts[keep] = backward_kernels(model, packed, bf16=bf16)
    layers = tiny_llama().config.num_hidden_layers
    (matmuls, attention), (kept_matmuls, kept_attention) = counts[False], counts[True]
    assert attention >= layers, counts  # the whole-layer recompute runs every layer's attention again
    if bf16:
        assert counts[True] == counts[False], counts
    else:
        assert matmuls - kept_matmuls == 6 * layers and kept_attention == 0, counts


def test_keep_matmuls_true_needs_a_hidden_size():
    from ajet.errors import ConfigError
    from ajet.training.model import enable_activation_checkpointing

    model = tiny_llama()
    object.__setattr__(model.config, "hidden_size", None)  # past the config's own validation
    with pytest.raises(ConfigError, match="checkpoint_keep_matmuls=true.*no hidden_size"):
        enable_activation_checkpointing(model, keep_matmuls=True)
    enable_activation_checkpointing(model)  # whole layers need no hidden_size
    assert model.is_activation_checkpointing


def test_drop_prefix_cache_frees_it_and_decoding_stays_the_same(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ajet.engine.local import LocalEngine
    from ajet.engine.requests import SamplingParams

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer.encode("A long enough prompt to be worth caching, about some topic or other.")
    params = SamplingParams(temperature=0, max_tokens=6)
    with LocalEngine(model, tokenizer, prefix_cache_tokens=4096) as engine:
        (first,) = asyncio.run(engine.generate(prompt, params))
        cache = engine._reuse.cache
        assert cache is not None and cache.tokens > 0
        engine.drop_prefix_cache()
        assert cache.tokens == 0
        engine.take_metrics()
        (again,) = asyncio.run(engine.generate(prompt, params))
        assert engine.take_metrics()["engine/cache_hit_rate"] == 0.0  # nothing was left to serve
        assert again.token_ids == first.token_ids


def test_release_memory_returns_freed_heap_pages():
    import sys

    import psutil

    from ajet.training.memory import release_memory

    if not sys.platform.startswith("linux"):
        pytest.skip("malloc_trim is glibc's")
    proc = psutil.Process()
    # 64 KB blocks stay below glibc's mmap threshold: freed, they stay in the heap until trimmed.
    blocks = [bytearray(64 * 1024) for _ in range(3000)]
    del blocks[:-1]  # the last one stays: free() alone cannot shrink the heap from its top
    before = proc.memory_info().rss
    assert release_memory()
    assert proc.memory_info().rss < before - 50e6


_RETENTION_CHILD = """
import sys
import psutil
import torch
from ajet.training.memory import limit_heap_retention

if sys.argv[1] == "limit":
    assert limit_heap_retention(1 << 20)
proc = psutil.Process()
first = torch.ones(4 << 20)  # 16 MB: mapped; freeing it raises glibc's adaptive threshold to 16 MB
del first
before = proc.memory_info().rss
big, small = [], []
for _ in range(40):
    big.append(torch.ones(2 << 20))  # 8 MB each, 320 MB
    # Blocks between them pin the heap: 512 KB, below either threshold, and larger than the holes
    # imports leave (64-byte pins were served from those holes, below the big blocks, once this
    # module grew: the heap's top then went back to the OS and nothing stayed to measure).
    small.append(torch.ones(128 << 10))
del big
print((proc.memory_info().rss - before) / 1e6)
"""


def test_limit_heap_retention_returns_freed_tensors_at_once():
    """Without the lever glibc keeps freed 8 MB tensors in its heap (no malloc_trim here); with
    it they were mapped on their own and went back to the OS when freed."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("mallopt(M_MMAP_THRESHOLD) is glibc's")
    kept = {}
    for mode in ("default", "limit"):
        out = subprocess.run([sys.executable, "-c", _RETENTION_CHILD, mode], capture_output=True, text=True,
                             timeout=120, check=True)
        kept[mode] = float(out.stdout.strip())
    assert kept["default"] > 250, kept  # MB still resident after del
    assert kept["limit"] < 40, kept



_STEP_HEAP_CHILD = """
import ctypes
import ctypes.util
import resource
import psutil
import torch
from ajet.training.memory import limit_heap_retention, step_heap_retention

assert limit_heap_retention(1 << 20)
# A step's live tensors keep the heap's top in use; here nothing would, and glibc would give the
# top back to the OS at each free (M_TRIM_THRESHOLD), so the top is kept as a step would keep it.
ctypes.CDLL(ctypes.util.find_library("c")).mallopt(-1, 1 << 30)


def churn():  # a step's pattern: the same activation size allocated, written and freed again and again
    live = [torch.ones(1 << 19), torch.ones(1 << 19)]  # 2 MB each; the second stays, above the first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        live[0] = None
        live[0] = torch.ones(1 << 19)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


outside = churn()
with step_heap_retention(8 << 20, 1 << 20):
    inside = churn()
proc = psutil.Process()
before = proc.memory_info().rss
big, small = [], []
for _ in range(40):
    big.append(torch.ones(1 << 20))  # 4 MB each: below the step's threshold, above the one restored
    small.append(torch.ones(128 << 10))  # 512 KB pins of the heap, as in _RETENTION_CHILD
del big
print(outside, inside, (proc.memory_info().rss - before) / 1e6)
"""


def test_step_heap_retention_reuses_a_steps_blocks_and_restores_the_threshold_after():
    """Inside a training step 2 MB blocks come from the heap and are reused without a page fault
    (outside, at the 1 MB threshold, each allocation faults its 512 pages in again); after the
    step the 1 MB threshold holds again, so freed 4 MB tensors go back to the OS at once."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("mallopt(M_MMAP_THRESHOLD) is glibc's")
    out = subprocess.run([sys.executable, "-c", _STEP_HEAP_CHILD], capture_output=True, text=True, timeout=120,
                         check=True)
    outside, inside, kept_mb = out.stdout.split()
    assert int(outside) > 50 * 400, out.stdout  # ~512 faults a 2 MB block
    assert int(inside) < int(outside) / 4, out.stdout  # measured: 25,650 against 512
    assert float(kept_mb) < 40, out.stdout  # 160 MB were freed


def test_step_heap_retention_changes_nothing_unless_both_thresholds_are_set_and_it_is_larger(monkeypatch):
    import ajet.training.memory as memory

    calls: list[tuple] = []

    class Libc:
        def mallopt(self, *args):
            calls.append(("mallopt", *args))
            return 1

        def malloc_trim(self, *args):
            calls.append(("malloc_trim", *args))
            return 1

    monkeypatch.setattr(memory, "_libc", Libc)
    for step, outer in [(4 << 20, 0), (0, 1 << 20), (1 << 20, 1 << 20), (1 << 20, 4 << 20)]:
        with memory.step_heap_retention(step, outer):
            pass
    assert calls == []  # 0 outside = glibc's adaptive threshold, which a fixed one would end for good
    with pytest.raises(KeyError), memory.step_heap_retention(4 << 20, 1 << 20):
        raise KeyError("a failing step")
    assert calls == [("mallopt", memory._M_MMAP_THRESHOLD, 4 << 20), ("mallopt", memory._M_MMAP_THRESHOLD, 1 << 20),
                     ("malloc_trim", 0)]


def test_limit_heap_retention_zero_leaves_malloc_alone():
    from ajet.training.memory import limit_heap_retention

    assert limit_heap_retention(0) is False


def test_training_runs_with_what_setup_built_frozen_and_collects_it_after() -> None:
    """run_recipe: `train` runs with setup's objects out of the collector's sight (a full
    collection then skips the ~530,000 objects of the imports); after the run, a cycle that
    setup built and train dropped (an earlier pipeline stage's model) is collected again."""
    import gc
    import weakref

    from ajet.training.recipe import run_recipe

    class Node:
        pass

    seen: dict[str, object] = {}

    class Recipe:
        def setup(self, closers) -> None:
            self.cycle = Node()
            self.cycle.self = self.cycle  # only the collector frees it
            seen["ref"] = weakref.ref(self.cycle)

        def train(self):
            seen["frozen"] = gc.get_freeze_count()
            del self.cycle
            gc.collect()
            seen["alive_in_train"] = seen["ref"]() is not None  # frozen: not collected inside
            return "run"

    assert run_recipe(Recipe()) == "run"
    assert seen["frozen"] > 1000 and seen["alive_in_train"]
    assert gc.get_freeze_count() == 0 and seen["ref"]() is None  # unfrozen and collected at the end
