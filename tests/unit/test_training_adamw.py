"""AdamW with bf16 moments (`trainer.optimizer_state_dtype: bfloat16`): half the state memory,
updates close to torch's fp32 AdamW, unbiased rounding that keeps the second moment moving,
and checkpoints that resume in bf16."""

from __future__ import annotations

import pytest
import torch

from ajet.config.schema import OptimizerStateDType, TrainerConfig
from ajet.training.adamw import BF16StateAdamW, stochastic_round_bf16
from ajet.training.optim import build_optimizer


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def train(model, optimizer, steps: int) -> float:
    """`steps` optimizer steps of next-token loss on fixed random batches; the last loss."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 96, (2, 24), generator=gen)
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    low = torch.tensor(1.0, dtype=torch.bfloat16)
    high = torch.nextafter(low, torch.tensor(2.0, dtype=torch.bfloat16))
    value = float(low) + 0.3 * (float(high) - float(low))  # 30% of the way up
    x = torch.full((200_000,), value, dtype=torch.float32)
    out = stochastic_round_bf16(x, torch.Generator().manual_seed(0))
    assert out.dtype == torch.bfloat16
    assert set(out.unique().tolist()) == {float(low), float(high)}
    assert float((out == high).float().mean()) == pytest.approx(0.3, abs=0.01)
    assert float(out.float().mean()) == pytest.approx(value, rel=1e-5)
    # values bf16 holds exactly stay as they are, signs included
    exact = torch.tensor([0.0, -2.5, 1.0, -0.125, 3.0e-5], dtype=torch.bfloat16).float()
    assert torch.equal(stochastic_round_bf16(exact).float(), exact)
    negative = stochastic_round_bf16(-x[:1000]).float()
    assert set(negative.unique().tolist()) == {-float(low), -float(high)}


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_bf16_state_updates_stay_close_to_fp32_adamw(weight_decay):
    reference, model = tiny_llama(), tiny_llama()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=weight_decay)
    opt = BF16StateAdamW(model.parameters(), lr=1e-3, weight_decay=weight_decay, seed=0)
    ref_loss, loss = train(reference, ref_opt, 5), train(model, opt, 5)
    assert loss == pytest.approx(ref_loss, rel=1e-3)
    for (name, p), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        moved, ref_moved = p.detach() - start[name], ref.detach() - start[name]
        # each step moves a weight by up to lr; the moments' 3 digits change that by ~1%
        assert torch.allclose(moved, ref_moved, rtol=0.03, atol=2e-5), name
        state = opt.state[p]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
        for key in ("exp_avg", "exp_avg_sq"):  # each element is off by at most ~1/128 of itself
            ours, theirs = state[key].float(), ref_opt.state[ref][key]
            assert float((ours - theirs).norm()) <= 0.01 * float(theirs.norm()) + 1e-12, (name, key)


def test_bf16_state_equals_torch_adamw_math_in_one_step():
    """One step from zero moments: m = (1-b1) g and v = (1-b2) g^2 round to bf16, and the
    bias-corrected update is ~lr * sign(g) either way; checks the update formula, slices included."""
    import ajet.training.adamw as adamw

    torch.manual_seed(0)
    p_ref = torch.nn.Parameter(torch.randn(5000))
    p = torch.nn.Parameter(p_ref.detach().clone())
    grad = torch.randn(5000)
    p_ref.grad, p.grad = grad.clone(), grad.clone()
    torch.optim.AdamW([p_ref], lr=0.01, weight_decay=0.05).step()
    old_slice, adamw._SLICE = adamw._SLICE, 777  # several slices and a ragged last one
    try:
        BF16StateAdamW([p], lr=0.01, weight_decay=0.05).step()
    finally:
        adamw._SLICE = old_slice
    assert torch.allclose(p.detach(), p_ref.detach(), rtol=0, atol=1e-4)


def test_second_moment_keeps_following_small_updates():
    """With a constant gradient g, v_t = (1 - 0.999^t) g^2. Round-to-nearest bf16 would stall
    near g^2 / 3 (each step adds 0.1%, under bf16's resolution); stochastic rounding does not."""
    p = torch.nn.Parameter(torch.zeros(4096))
    opt = BF16StateAdamW([p], lr=1e-6, weight_decay=0.0)
    steps = 2000
    for _ in range(steps):
        p.grad = torch.full_like(p, 0.5)
        opt.step()
    expected = (1 - 0.999 ** steps) * 0.25
    assert float(opt.state[p]["exp_avg_sq"].float().mean()) == pytest.approx(expected, rel=0.02)


def test_checkpoint_resumes_with_bf16_state_and_half_the_memory():
    model = tiny_llama()
    opt = BF16StateAdamW(model.parameters(), lr=1e-3)
    train(model, opt, 2)
    saved = opt.state_dict()
    fresh = BF16StateAdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(saved)
    for p in model.parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            assert fresh.state[p][key].dtype == torch.bfloat16
            assert torch.equal(fresh.state[p][key], opt.state[p][key])
        assert int(fresh.state[p]["step"]) == 2
    state_bytes = sum(t.nbytes for s in opt.state.values() for k, t in s.items() if k != "step")
    assert state_bytes == sum(p.nbytes for p in model.parameters())  # 2 moments x 2 bytes = 4 bytes


def test_build_optimizer_follows_the_config():
    model = tiny_llama()
    fp32, _ = build_optimizer(model, TrainerConfig())
    bf16, _ = build_optimizer(model, TrainerConfig(optimizer_state_dtype=OptimizerStateDType.bfloat16))
    assert type(fp32) is torch.optim.AdamW
    assert isinstance(bf16, BF16StateAdamW)
