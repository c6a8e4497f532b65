"""ReferencePolicy: frozen copy stays at the initial weights; lora_base = adapters off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ajet.algorithms.reference import ReferencePolicy, build_reference
from ajet.config.schema import AlgorithmConfig


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 10)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.drop(x))


def token_logprobs(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(model(x), -1).gather(-1, labels[:, None]).squeeze(-1)


X = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
LABELS = torch.tensor([1, 5, 0, 9])


def test_frozen_reference_keeps_initial_policy():
    model = TinyLM().train()
    with torch.no_grad():
        initial = token_logprobs(model.eval(), X, LABELS)
    model.train()
    ref = ReferencePolicy(model, "frozen")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    token_logprobs(model, X, LABELS).sum().neg().backward()
    opt.step()
    out = ref.ref_logprobs(token_logprobs, X, LABELS)
    assert not out.requires_grad
    torch.testing.assert_close(out, initial)  # eval mode: dropout off, deterministic
    with torch.no_grad():
        assert not torch.allclose(token_logprobs(model.eval(), X, LABELS), initial)


def test_lora_base_disables_adapter_and_restores_it():
    import peft  # a required dependency, imported where it is used (it is heavy)
    model = TinyLM().eval()
    with torch.no_grad():
        base_out = token_logprobs(model, X, LABELS)
    # init_lora_weights=False: B is random, so the adapter changes the output from the start
    cfg = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["proj"], init_lora_weights=False)
    lora = peft.get_peft_model(model, cfg).train()
    ref = ReferencePolicy(lora, "lora_base")
    out = ref.ref_logprobs(token_logprobs, X, LABELS)
    torch.testing.assert_close(out, base_out)
    assert not out.requires_grad
    assert lora.training  # train mode restored
    lora.eval()
    with torch.no_grad():
        adapted = token_logprobs(lora, X, LABELS)
    assert not torch.allclose(adapted, base_out)  # adapter is back on after the block


def test_lora_base_needs_a_peft_model_and_kinds_are_checked():
    with pytest.raises(ValueError, match="kl_reference=frozen"):
        ReferencePolicy(TinyLM(), "lora_base")
    with pytest.raises(ValueError, match="unknown"):
        ReferencePolicy(TinyLM(), "ema")


def test_build_reference_only_with_kl():
    model = TinyLM()
    assert build_reference(model, AlgorithmConfig(kl_coef=0.0)) is None
    ref = build_reference(model, AlgorithmConfig(kl_coef=0.01, kl_reference="frozen"))
    assert isinstance(ref, ReferencePolicy) and ref.kind == "frozen"
