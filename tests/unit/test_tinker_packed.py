"""`ajet tinker`'s forward_backward packs datums whose targets are their tokens shifted (a group's
shared prompt forwarded once); the logprobs, the loss and every adapter gradient equal the datums'
own forwards, and a datum with other targets still gets its own forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ajet.tinker_service import trainer as trainer_module
from ajet.tinker_service.trainer import LoraSpec, LoraTrainer
from ajet.tinker_service.wire import DatumIn, ForwardBackwardIn
from ajet.training.adapters import adapter_parameters


@pytest.fixture(scope="module")
def lora(tiny_model_dir: Path) -> LoraTrainer:
    from transformers import AutoModelForCausalLM

    trainer = LoraTrainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32"))
    trainer.create("c", LoraSpec(rank=4, alpha=8), seed=0)
    with torch.no_grad():  # B = 0 would give A no gradient: make the adapter non-trivial
        for name, p in adapter_parameters(trainer.model, "c").items():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return trainer


def rl_datum(prompt: list[int], reply: list[int], advantage: float) -> DatumIn:
    tokens = prompt + reply
    n = len(tokens) - 1
    weights = np.array([0.0] * (len(prompt) - 1) + [1.0] * len(reply), dtype=np.float32)
    return DatumIn(tokens=tokens[:-1], inputs={
        "target_tokens": np.array(tokens[1:], dtype=np.int64),
        "logprobs": np.full(n, -2.0, dtype=np.float32),
        "advantages": (weights * advantage).astype(np.float32),
    })


def grads_after(lora: LoraTrainer, request: ForwardBackwardIn) -> tuple[list[np.ndarray], float, dict[str, torch.Tensor]]:
    params = adapter_parameters(lora.model, "c")
    for p in params.values():
        p.grad = None
    outputs, metrics = lora.forward_backward(request)
    grads = {k: p.grad.clone() for k, p in params.items() if p.grad is not None}
    return [o["logprobs"] for o in outputs], metrics["loss:sum"], grads


def test_packed_datums_match_their_own_forwards(lora: LoraTrainer, monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = [5, 17, 33, 8, 91, 12, 7]
    data = [rl_datum(prompt, [40 + k, 50 + k, 60], adv) for k, adv in enumerate([1.0, -0.5, 0.25, -0.75])]
    data.append(rl_datum([3, 4], [9, 9, 9, 2], 0.5))  # another tree in the same forward
    odd = rl_datum(prompt, [70, 71], 1.0)
    odd.inputs["target_tokens"] = odd.inputs["target_tokens"][::-1].copy()  # not the tokens shifted
    data.append(odd)
    request = ForwardBackwardIn(model_id="c", seq_id=0, loss_fn="ppo", config={}, data=data, forward_only=False)

    forwards: list[int] = []
    packed = trainer_module._packed_logprobs

    def counting(model: object, batch: list[DatumIn]):  # type: ignore[no-untyped-def]
        for item in packed(model, batch):
            forwards.append(len(item[0]))
            yield item

    monkeypatch.setattr(trainer_module, "_packed_logprobs", counting)
    got_lp, got_loss, got_grads = grads_after(lora, request)
    assert forwards == [5]  # the five shifted datums in one packed forward; the odd one alone

    monkeypatch.setattr(trainer_module, "_shifted", lambda datum: False)  # every datum alone
    want_lp, want_loss, want_grads = grads_after(lora, request)
    assert len(got_lp) == len(data)
    for got, want, datum in zip(got_lp, want_lp, data, strict=True):
        assert got.shape == (len(datum.tokens),)
        np.testing.assert_allclose(got, want, atol=2e-5)
    assert got_loss == pytest.approx(want_loss, abs=1e-4)
    assert got_grads.keys() == want_grads.keys() and got_grads
    for name, grad in got_grads.items():
        torch.testing.assert_close(grad, want_grads[name], atol=2e-5, rtol=1e-4, msg=name)


def test_forward_only_packs_without_gradients(lora: LoraTrainer) -> None:
    data = [rl_datum([5, 6, 7], [8, 9], 1.0), rl_datum([5, 6, 7], [10, 11], -1.0)]
    request = ForwardBackwardIn(model_id="c", seq_id=1, loss_fn="importance_sampling", config={}, data=data,
                                forward_only=True)
    lps, _, grads = grads_after(lora, request)
    assert grads == {}
    assert [lp.shape for lp in lps] == [(4,), (4,)]
    assert np.allclose(lps[0][:2], lps[1][:2], atol=1e-6)  # the shared prompt's tokens
    assert not np.allclose(lps[0][2:], lps[1][2:])
