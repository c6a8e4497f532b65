"""DPO losses on hand-computed values, and preference pair building."""

from __future__ import annotations

import math

import pytest
import torch

from ajet.algorithms.dpo import build_preference_pairs, dpo_loss


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


# pair 0: policy margin 2, ref margin 0 -> logits 2; pair 1: policy 0, ref 1 -> logits -1
PI_C, PI_R = _t(-10.0, -5.0), _t(-12.0, -5.0)
REF_C, REF_R = _t(-11.0, -4.0), _t(-11.0, -5.0)
BETA = 0.5  # beta * logits = [1, -0.5]


def test_sigmoid_hand_values():
    losses, rc, rr = dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=BETA)
    # -log sigmoid(1) = log(1 + e^-1); -log sigmoid(-0.5) = log(1 + e^0.5)
    assert losses.tolist() == pytest.approx([0.31326168751822286, 0.9740769841801067])
    assert rc.tolist() == pytest.approx([0.5, -0.5])  # 0.5 * (-10 + 11), 0.5 * (-5 + 4)
    assert rr.tolist() == pytest.approx([-0.5, 0.0])


def test_sigmoid_label_smoothing_hand_values():
    losses, _, _ = dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=BETA, label_smoothing=0.1)
    # 0.9 * log(1 + e^-1) + 0.1 * log(1 + e^1)
    assert losses[0].item() == pytest.approx(0.9 * 0.31326168751822286 + 0.1 * 1.3132616875182228)
    assert losses[1].item() == pytest.approx(0.9 * 0.9740769841801067 + 0.1 * 0.47407698418010663)


def test_hinge_and_ipo_hand_values():
    hinge, _, _ = dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=BETA, loss_type="hinge")
    assert hinge.tolist() == pytest.approx([0.0, 1.5])  # relu(1 - 1), relu(1 + 0.5)
    ipo, _, _ = dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=BETA, loss_type="ipo")
    assert ipo.tolist() == pytest.approx([1.0, 4.0])  # (2 - 1)^2, (-1 - 1)^2


def test_reference_free_ignores_reference_margin():
    losses, rc, _ = dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=BETA, reference_free=True)
    # logits = policy margins [2, 0] -> log(1 + e^-1), log 2
    assert losses.tolist() == pytest.approx([0.31326168751822286, math.log(2)])
    assert rc.tolist() == pytest.approx([0.5, -0.5])  # rewards still use the given reference
    losses_none, rc_none, _ = dpo_loss(PI_C, PI_R, None, None, beta=BETA, reference_free=True)
    assert torch.equal(losses_none, losses)
    assert rc_none.tolist() == pytest.approx([-5.0, -2.5])
    with pytest.raises(ValueError, match="reference_free"):
        dpo_loss(PI_C, PI_R, None, None, beta=BETA)


def test_sigmoid_gradient_hand_derived():
    pc = PI_C.clone().requires_grad_(True)
    pr = PI_R.clone().requires_grad_(True)
    losses, rc, _ = dpo_loss(pc, pr, REF_C, REF_R, beta=BETA)
    losses.sum().backward()
    # d/d pi_c of -log sigmoid(beta z) = -beta * sigmoid(-beta z); opposite sign for pi_r
    expected = [-0.5 * (1 / (1 + math.exp(1.0))), -0.5 * (1 / (1 + math.exp(-0.5)))]
    assert pc.grad.tolist() == pytest.approx(expected)
    assert pr.grad.tolist() == pytest.approx([-g for g in expected])
    assert not rc.requires_grad


def test_dpo_rejects_bad_settings():
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=BETA, loss_type="kto")
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=BETA, loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(PI_C, PI_R, REF_C, REF_R, beta=0.0)


def test_preference_pairs_best_vs_worst_ties_skipped():
    episodes = [
        ("g1", "a", 0.2),
        ("g2", "x", 1.0),
        ("g1", "b", 0.9),
        ("g1", "c", -0.1),
        ("g2", "y", 1.0),  # g2 all tied -> no pair
        ("g3", "solo", 3.0),  # one episode -> no pair
        ("g4", "p", 0.0),
        ("g4", "q", 1.0),
        ("g4", "r", 1.0),
        ("g4", "s", 0.0),  # first wins ties
    ]
    assert build_preference_pairs(episodes) == [("b", "c"), ("q", "p")]
    assert build_preference_pairs([]) == []
