"""SFT update on packed samples: loss and gradient equal the plain per-sample computation."""

from __future__ import annotations

import pytest
import torch

from ajet.config.schema import TrainerConfig
from ajet.context.types import Sample
from ajet.sft.step import mean_nll, sample_nll, sft_step
from ajet.training.step import OptimizerStep

NO_CLIP = TrainerConfig(grad_clip=1e9)  # the gradients as computed


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def make(ids: list[int], trained: set[int], name: str) -> Sample:
    mask = [1 if t in trained else 0 for t in range(len(ids))]
    return Sample(input_ids=ids, loss_mask=mask, old_logprobs=[0.0] * len(ids), episode_id=name)


# Two dialogs sharing a system-prompt prefix (tree packing forwards it once) and one apart.
SAMPLES = [
    make([1, 2, 3, 4, 5, 6, 7], {4, 5}, "a"),
    make([1, 2, 3, 4, 9, 10, 11, 12], {5, 6, 7}, "b"),
    make([20, 21, 22, 23], {2, 3}, "c"),
]


def manual_nll(model, sample: Sample) -> torch.Tensor:
    logits = model(torch.tensor([sample.input_ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return -sum(logp[t - 1, sample.input_ids[t]] for t, m in enumerate(sample.loss_mask) if m)


class GradCapture:
    """An optimizer stand-in: zero_grad works, step records the gradients and changes nothing."""

    def __init__(self, model) -> None:
        self.model = model
        self.grads: dict[str, torch.Tensor] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}


def test_sample_nll_matches_plain_forwards(model) -> None:
    with torch.no_grad():
        expected = [(float(manual_nll(model, s)), sum(s.loss_mask)) for s in SAMPLES]
    for budget in (4096, 0):  # tree-packed, then one sequence per sample
        got = sample_nll(model, SAMPLES, micro_batch_tokens=budget)
        assert [n for _, n in got] == [2, 3, 2]
        assert [v for v, _ in got] == pytest.approx([v for v, _ in expected], rel=1e-4)
    assert mean_nll(got) == pytest.approx(sum(v for v, _ in expected) / 7, rel=1e-4)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_sft_step_loss_and_gradient_equal_unpacked(model, loss_agg: str) -> None:
    model.zero_grad()
    nlls = [manual_nll(model, s) for s in SAMPLES]
    counts = [sum(s.loss_mask) for s in SAMPLES]
    if loss_agg == "token_mean":
        loss = sum(nlls) / sum(counts)
    else:  # every sample (= one call here) weighs the same
        loss = sum(n / c for n, c in zip(nlls, counts, strict=True)) / len(SAMPLES)
    loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}

    for budget in (4096, 9, 0):  # one tree, cut into groups, unpacked
        capture = GradCapture(model)
        metrics = sft_step(OptimizerStep(model, capture, NO_CLIP), SAMPLES, loss_agg=loss_agg, micro_batch_tokens=budget)
        assert metrics["sft/loss"] == pytest.approx(float(loss.detach()), rel=1e-4)
        assert metrics["sft/trained_tokens"] == 7
        for name, grad in expected.items():
            torch.testing.assert_close(capture.grads[name], grad, rtol=1e-4, atol=1e-6)
    assert not model.training  # back in eval mode
    assert all(p.grad is None for p in model.parameters())  # spent after the step: freed
    packed = sft_step(OptimizerStep(model, GradCapture(model), NO_CLIP), SAMPLES, loss_agg=loss_agg, micro_batch_tokens=4096)
    assert packed["sft/tokens_packed"] == 7 + 4 + 4 < packed["sft/tokens"] == 19  # the shared prefix once
