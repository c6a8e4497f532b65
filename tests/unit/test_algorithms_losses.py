"""Losses against per-entry loops / numpy references and hand-derived gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ajet.algorithms.losses import kl_penalty, policy_loss, sft_loss


def _random_entries(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, generator=g, dtype=torch.float64) * 4
    new = old + torch.randn(n, generator=g, dtype=torch.float64) * 0.3  # ratios ~0.4..2.5
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    w = torch.rand(n, generator=g, dtype=torch.float64)
    return new, old, adv, w / w.sum()


def _loop_ppo(new, old, adv, w, lo, hi, dual_c=None):
    total, clipped = 0.0, 0
    for n_, o, a, wt in zip(new.tolist(), old.tolist(), adv.tolist(), w.tolist(), strict=True):
        r = math.exp(n_ - o)
        r_clip = min(max(r, 1 - lo), 1 + hi)
        obj = min(r * a, r_clip * a)
        loss = -obj
        if dual_c is not None and a < 0:
            loss = min(loss, -dual_c * a)
        clipped += r_clip * a < r * a  # the clipped objective is the one taken
        total += wt * loss
    return total, clipped / len(w)


@pytest.mark.parametrize("lo,hi", [(0.2, 0.2), (0.2, 0.28)])
def test_ppo_loss_matches_loop(lo, hi):
    new, old, adv, w = _random_entries()
    loss, metrics = policy_loss(new, old, adv, w, clip_low=lo, clip_high=hi)
    want, want_frac = _loop_ppo(new, old, adv, w, lo, hi)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics["clip_frac"] == pytest.approx(want_frac)
    assert 0 < metrics["clip_frac"] < 1  # the inputs do exercise both branches
    ratio = np.exp(new.numpy() - old.numpy())
    assert metrics["ratio_mean"] == pytest.approx(ratio.mean())
    log_r = new.numpy() - old.numpy()
    assert metrics["approx_kl"] == pytest.approx(np.mean(np.exp(log_r) - 1 - log_r))
    assert metrics["n_entries"] == 64


def test_dual_clip_matches_loop():
    new, old, adv, w = _random_entries(seed=1)
    new = new.clone()
    new[:4] = old[:4] + math.log(5.0)  # ratio 5: dual clip binds where A < 0
    adv[:4] = torch.tensor([-1.0, -2.0, 1.0, -0.5], dtype=torch.float64)
    loss, _ = policy_loss(
        new, old, adv, w, clip_low=0.2, clip_high=0.2, mode="dual_clip", clip_c=3.0
    )
    want, _ = _loop_ppo(new, old, adv, w, 0.2, 0.2, dual_c=3.0)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    plain, _ = policy_loss(new, old, adv, w, clip_low=0.2, clip_high=0.2)
    assert loss.item() < plain.item()


def test_ppo_gradient_hand_derived():
    # ratio, advantage -> (clipped?) with clip 0.2: d loss / d new = -w * r * A unless clipped
    cases = [
        (1.1, 1.0, False),
        (1.5, 1.0, True),
        (0.5, 1.0, False),
        (0.5, -1.0, True),
        (1.5, -1.0, False),
        (0.9, -2.0, False),
        (0.7, -0.5, True),
    ]
    ratios = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    adv = torch.tensor([c[1] for c in cases], dtype=torch.float64)
    old = torch.full_like(ratios, -2.0)
    new = (old + ratios.log()).requires_grad_(True)
    w = torch.full_like(ratios, 0.25)
    loss, metrics = policy_loss(new, old, adv, w, clip_low=0.2, clip_high=0.2)
    loss.backward()
    expected = [0.0 if clipped else -0.25 * r * a for r, a, clipped in cases]
    np.testing.assert_allclose(new.grad.numpy(), expected, rtol=1e-12, atol=1e-15)
    assert metrics["clip_frac"] == pytest.approx(sum(c[2] for c in cases) / len(cases))


def test_on_policy_grpo_is_policy_gradient():
    new, _, adv, w = _random_entries(seed=2)
    new = new.clone().requires_grad_(True)
    loss, metrics = policy_loss(new, new.detach(), adv, w, clip_low=0.2, clip_high=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-(w * adv).sum().item(), rel=1e-12)
    np.testing.assert_allclose(new.grad.numpy(), (-w * adv).numpy(), rtol=1e-12)
    assert metrics["clip_frac"] == 0.0 and metrics["approx_kl"] == 0.0
    assert metrics["ratio_mean"] == 1.0


def test_policy_loss_rejects_bad_inputs():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="shapes"):
        policy_loss(x, x, torch.zeros(2), x, clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="mode"):
        policy_loss(x, x, x, x, clip_low=0.2, clip_high=0.2, mode="gspo")


def test_kl_kinds_match_numpy():
    new, ref, _, _ = _random_entries(seed=3)
    d = new.numpy() - ref.numpy()
    np.testing.assert_allclose(kl_penalty(new, ref, "k1").numpy(), d, rtol=1e-12)
    np.testing.assert_allclose(kl_penalty(new, ref, "k2").numpy(), 0.5 * d**2, rtol=1e-12)
    np.testing.assert_allclose(kl_penalty(new, ref, "k3").numpy(), np.exp(-d) + d - 1, rtol=1e-10)
    assert (kl_penalty(new, ref, "k3") >= 0).all()
    # identical policies: every estimator is 0
    assert kl_penalty(ref, ref, "k3").abs().max() == 0
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(new, ref, "k4")


def test_k3_clamped_like_verl():
    new = torch.tensor([0.0, 0.0, -50.0])
    ref = torch.tensor([-50.0, 3.0, 0.0])
    kl = kl_penalty(new, ref, "k3")
    assert torch.isfinite(kl).all()
    assert kl.tolist() == pytest.approx([min(math.exp(-20) + 20 - 1, 10.0), 10.0, 10.0])


def test_k3_estimates_true_kl():
    # E_{x~new}[k3] = KL(new || ref) on a small categorical
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.5, 0.3])
    rng = np.random.default_rng(0)
    x = rng.choice(3, size=200_000, p=p)
    k3 = kl_penalty(torch.tensor(np.log(p[x])), torch.tensor(np.log(q[x])), "k3")
    assert k3.mean().item() == pytest.approx(float((p * np.log(p / q)).sum()), rel=0.02)


def test_the_trainers_entropy_matches_numpy_and_is_stable():
    """The entropy the trainer logs (`actor/entropy`): `token_logprobs(..., with_entropy=True)`."""
    from ajet.forward.logprobs import token_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(15, 11, generator=g, dtype=torch.float64) * 3
    z = logits.numpy()
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tokens = torch.zeros(15, dtype=torch.long)
    _, entropy = token_logprobs(logits, lambda h: h, tokens, with_entropy=True)
    np.testing.assert_allclose(entropy.numpy(), -(p * np.log(p)).sum(-1), rtol=1e-5)
    # shift invariance at a scale where naive exp overflows; half precision is computed in fp32
    assert not torch.isfinite(torch.exp(logits + 1e3)).all()
    _, big = token_logprobs(logits + 1e3, lambda h: h, tokens, with_entropy=True)
    torch.testing.assert_close(big, entropy.float(), rtol=1e-5, atol=1e-5)
    _, half = token_logprobs(logits.bfloat16(), lambda h: h, tokens, with_entropy=True)
    assert half.dtype == torch.float32
    # one-hot-ish: entropy -> 0, never negative or nan
    _, peaked = token_logprobs(torch.tensor([[1e4, 0.0, 0.0]]), lambda h: h, tokens[:1], with_entropy=True)
    assert 0 <= peaked.item() < 1e-6


def test_sft_loss_weighted_nll_and_gradient():
    lp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    w = torch.tensor([0.5, 0.25, 0.25])
    loss = sft_loss(lp, w)
    assert loss.item() == pytest.approx(0.5 * 1 + 0.25 * 2 + 0.25 * 0.5)
    loss.backward()
    assert lp.grad.tolist() == [-0.5, -0.25, -0.25]


def test_tis_weights_and_loss_by_hand():
    from ajet.algorithms.losses import tis_weights

    trainer_old = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    engine = torch.tensor([-1.2, -1.0, -0.5], dtype=torch.float64)
    # exp(0.2) = 1.2214 is capped at 1.1; exp(-1.0) = 0.3679 and exp(0) = 1 stay.
    is_w = tis_weights(trainer_old, engine, cap=1.1)
    torch.testing.assert_close(is_w, torch.tensor([1.1, math.exp(-1.0), 1.0], dtype=torch.float64))
    assert tis_weights(trainer_old, engine, cap=10.0)[0].item() == pytest.approx(math.exp(0.2))
    # First pass of an update: new == trainer_old in value, so r = exp(new - trainer_old) = 1
    # (never clipped) and d loss / d new = -w * A * tis.
    new = trainer_old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    loss, _ = policy_loss(new, trainer_old, adv, w, clip_low=0.2, clip_high=0.2, is_weights=is_w)
    want = 0.5 * -1.0 * 1.1 + 0.25 * 2.0 * math.exp(-1.0) + 0.25 * -0.5 * 1.0
    assert loss.item() == pytest.approx(want, rel=1e-12)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([-0.55, 0.5 * math.exp(-1.0), -0.125], dtype=torch.float64))
    # Without the correction every token weighs the same.
    plain, _ = policy_loss(new.detach(), trainer_old, adv, w, clip_low=0.2, clip_high=0.2)
    assert plain.item() == pytest.approx(-0.5 + 0.5 - 0.125)
    with pytest.raises(ValueError, match="cap"):
        tis_weights(trainer_old, engine, cap=0.0)
    with pytest.raises(ValueError, match="one value per loss entry"):
        policy_loss(new, trainer_old, adv, w, clip_low=0.2, clip_high=0.2, is_weights=is_w[:2])
