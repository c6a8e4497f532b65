"""scripts/bench/roofline.py: its FLOP and byte counts against a hand computation for a tiny
config (and against torch's own FLOP counter on a tiny Llama), its phase clock on a real
`OptimizerStep`, and the table it prints. No timing is asserted."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ajet.config.schema import OptimizerStateDType, TrainerConfig
from ajet.context.pack import PackedSequence
from ajet.training.optim import build_optimizer
from ajet.training.step import OptimizerStep, Update

# hidden 8, intermediate 16, 2 layers, 2 heads of 4, 1 KV head, vocab 32. One layer's linears:
# q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate 8x16 + up 8x16 + down 16x8 = 576 weights; the head 8x32 = 256.
TINY = {"hidden": 8, "intermediate": 16, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 4, "vocab": 32}


@pytest.fixture
def roofline(script: Any) -> Any:
    return script("bench.roofline")


def tree() -> PackedSequence:
    """A 2-token trunk with two branches: depths 0, 1, 2, 3 | 2; three loss entries."""
    return PackedSequence(input_ids=[1, 2, 3, 4, 5], position_ids=[0, 1, 2, 3, 2], parents=[-1, 0, 1, 2, 1],
                          entry_pos=[1, 2, 3], entry_token=[3, 4, 5])


def test_the_shape_and_its_weights(roofline: Any) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=32, tie_word_embeddings=True)
    shape = roofline.Shape.of(config)
    assert shape == roofline.Shape(**TINY)
    assert (shape.layer_weights, shape.head_weights, shape.matmul_weights) == (576, 256, 2 * 576 + 256)
    model = LlamaForCausalLM(config)  # every weight but the norms' is a matmul's (the table tied as the head)
    assert shape.matmul_weights == sum(p.numel() for n, p in model.named_parameters() if "norm" not in n)
    assert shape.kv_bytes_per_token(4) == 2 * 2 * 1 * 4 * 4


def test_flops_of_a_tree_packed_step_by_hand(roofline: Any) -> None:
    shape = roofline.Shape(**TINY)
    t = roofline.Tokens.packed([tree()])
    assert t == roofline.Tokens(tokens=5, head_rows=3, attended=1 + 2 + 3 + 4 + 3)
    layers = 2 * 2 * 576 * 5 + 4 * 2 * 2 * 4 * 13  # GEMMs 11,520 + attention 832
    head = 2 * 256 * 3  # 1,536
    assert roofline.forward_flops(shape, t) == layers + head == 13_888
    assert roofline.backward_flops(shape, t, recompute_layers=False, recompute_head=False) == 2 * 13_888
    assert roofline.backward_flops(shape, t, recompute_layers=True, recompute_head=True) == 2 * 13_888 + layers + head
    assert roofline.backward_flops(shape, t, recompute_layers=False, recompute_head=True) == 2 * 13_888 + head
    down = 2 * 2 * 16 * 8 * 5  # kept matmuls (trainer.checkpoint_keep_matmuls): only down is recomputed
    assert roofline.backward_flops(shape, t, recompute_layers=True, recompute_head=True,
                                   kept_matmuls=True) == 2 * 13_888 + down + head
    # A prefill: causal attention within each prompt, logits at its last token.
    assert roofline.Tokens.prompts([3, 5]) == roofline.Tokens(tokens=8, head_rows=2, attended=6 + 15)


def test_the_backward_limit_mixes_in_the_gemms_that_are_recomputed(roofline: Any) -> None:
    """With kept matmuls the backward's recomputed GEMMs are the down projections alone, and its
    limit is measured on those, not on the whole layers' forward."""
    shape = roofline.Shape(**TINY)
    t = roofline.Tokens.packed([tree()])
    gemm = roofline.gemm_times(shape, t, "fp32", repeats=1)
    assert {part: flops for part, (flops, _) in gemm.items()} == {
        "layers forward": 11_520, "layers backward": 2 * 11_520, "head forward": 1_536, "head backward": 2 * 1_536,
        "down forward": 2 * 2 * 16 * 8 * 5}
    # Made-up times, so that each mix has its own rate.
    gemm = {part: (flops, seconds) for (part, (flops, _)), seconds in zip(gemm.items(), [1.0, 2.0, 3.0, 4.0, 5.0],
                                                                         strict=True)}
    run = roofline.StepRun(tokens=t, sequences=1, steps=1, seconds=1.0, phases={"backward": 1.0},
                           optimizer_bytes=0, clip_check_bytes=0, optimizer_steps=1)

    def backward_limit(kept: bool) -> float:
        phases = roofline.training_phases("SFT", shape, run, gemm, {"triad": 1.0}, "fp32", recompute_layers=True,
                                          recompute_head=False, state="fp32", kept_matmuls=kept)
        (backward,) = [phase for phase in phases if phase.name == "SFT backward"]
        return backward.limit

    recomputed = {False: "layers forward", True: "down forward"}
    for kept, part in recomputed.items():
        assert backward_limit(kept) == roofline.gemm_limit(gemm, ["layers backward", "head backward", part])
    assert backward_limit(True) != backward_limit(False)


def test_the_gemm_count_matches_torchs_flop_counter(roofline: Any) -> None:
    """torch counts every matmul of a tiny Llama's forward and backward; attention it counts as
    the full square (T x T), where the roofline counts the causal pairs."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=32, tie_word_embeddings=True, attn_implementation="eager")
    shape, n = roofline.Shape.of(config), 6
    model = LlamaForCausalLM(config)
    with FlopCounterMode(display=False) as forward:
        logits = model(torch.arange(n)[None]).logits
    with FlopCounterMode(display=False) as backward:
        logits.sum().backward()
    t = roofline.Tokens(tokens=n, head_rows=n, attended=n * (n + 1) // 2)
    square = 4 * shape.layers * shape.heads * shape.head_dim * (n * n - t.attended)
    assert forward.get_total_flops() == roofline.forward_flops(shape, t) + square
    assert backward.get_total_flops() == roofline.backward_flops(
        shape, t, recompute_layers=False, recompute_head=False) + 2 * square


def test_bytes_of_decode_and_of_the_optimizer_by_hand(roofline: Any) -> None:
    shape = roofline.Shape(**TINY)
    # 2 steps over prompts of 3 and 5 tokens: contexts (3+1) + (3+2) and (5+1) + (5+2) = 22 tokens of KV.
    moved = roofline.decode_bytes(shape, weight_element=4, kv_element=4, prompt_lengths=[3, 5], steps=2)
    assert moved == 1408 * 4 * 2 + 64 * 22
    assert roofline.optimizer_bytes([(40, 40, [40, 40]), (8, 8, [8, 8])]) == 280 + 56
    assert roofline.clip_check_bytes(param_bytes=48, grad_bytes=48) == 4 * 48


@pytest.mark.parametrize(("state_dtype", "per_param"), [(OptimizerStateDType.float32, 28),
                                                        (OptimizerStateDType.bfloat16, 20)])
def test_optimizer_bytes_from_a_real_optimizers_state(roofline: Any, state_dtype: Any, per_param: int) -> None:
    """AdamW reads and writes the weight and both moments and reads the gradient: 28 bytes a
    parameter in fp32, 20 with bf16 moments (the step count, a scalar, left out)."""
    model = torch.nn.Linear(4, 3)
    optimizer, _ = build_optimizer(model, TrainerConfig(optimizer_state_dtype=state_dtype))
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert roofline.optimizer_bytes(roofline.state_tensors(optimizer)) == per_param * 15


def test_the_clock_times_each_phase_of_a_real_update_and_leaves_nothing_behind(roofline: Any) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = OptimizerStep(model, optimizer, TrainerConfig())
    seq = tree()

    def seq_loss(_: PackedSequence) -> tuple[torch.Tensor, dict[str, float]]:
        return model(torch.ones(2, 4)).sum(), {}

    clock = roofline.PhaseClock()
    forward = Update.forward
    with clock.installed(optimizer):
        step.run([seq, seq], seq_loss)
        step.run([seq], seq_loss)
    assert dict(clock.calls) == {"forward": 3, "backward": 3, "clip + check": 4, "optimizer": 2}
    assert all(seconds > 0 for seconds in clock.seconds.values())
    assert Update.forward is forward  # unpatched
    step.run([seq], seq_loss)
    assert clock.calls["optimizer"] == 2  # the hooks are gone


def test_the_table(roofline: Any) -> None:
    phases = [roofline.Phase("rollout decode", "float32", 2e9, "B", 1.0, 4e9, "memory, triad"),
              roofline.Phase("SFT forward", "fp32", 30e9, "FLOP", 2.0, None, "")]
    assert roofline.roofline_table(phases) == [
        "| phase | dtype | work | time, s | achieved | limit, measured here | share |",
        "|---|---|---:|---:|---:|---|---:|",
        "| rollout decode | float32 | 2.0 GB | 1.000 | 2.0 GB/s | 4.0 GB/s (memory, triad) | 50 % |",
        "| SFT forward | fp32 | 30.0 GFLOP | 2.000 | 15.0 GFLOP/s | — | — |",
    ]
