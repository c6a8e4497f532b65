"""DPO on rollouts: best-vs-worst pairs, sequence log-probs = summed completion log-probs,
and the two-pass micro-batched update has the gradient of the one-batch loss."""

from __future__ import annotations

import copy

import pytest
import torch

from ajet.config.schema import AlgorithmConfig, ContextConfig, TrainerConfig
from ajet.context.types import Timeline
from ajet.dpo.pairs import build_pair_batch, sequence_logps
from ajet.dpo.step import dpo_step, packed_sequence_logps, pair_loss
from ajet.rollout.episode import Episode
from ajet.training.step import OptimizerStep
from ajet.workflow import WorkflowTask

NO_CLIP = TrainerConfig(grad_clip=1e9)  # the gradients as computed

PROMPT = [1, 2, 3, 4]


def episode(group: str, index: int, reward: float, completions: list[list[int]]) -> Episode:
    """A ReAct-like episode: each call's prompt is the previous prompt + completion + 2 tokens."""
    tokens, trainable, spans = list(PROMPT), [False] * len(PROMPT), []
    for k, completion in enumerate(completions):
        if k:
            tokens += [5, 6]
            trainable += [False, False]
        spans.append((len(tokens), len(tokens) + len(completion)))
        tokens += completion
        trainable += [True] * len(completion)
    timeline = Timeline(timeline_id=0, role="default", token_ids=tokens, trainable=trainable,
                        logprobs=[0.0] * len(tokens), call_indices=list(range(len(completions))),
                        completion_spans=spans)
    task = WorkflowTask(task_id=group, main_query="q")
    return Episode(episode_id=f"{group}-e{index}", task=task, group_id=group, reward=reward,
                   is_success=reward >= 1, timelines=[timeline], num_calls=len(completions))


EPISODES = [
    episode("g1", 0, 0.5, [[10, 11]]),
    episode("g1", 1, 1.0, [[12, 13, 14], [15]]),  # best of g1: two calls, 4 trained tokens
    episode("g1", 2, 0.0, [[16]]),  # worst of g1
    episode("g2", 0, 0.3, [[17]]),
    episode("g2", 1, 0.3, [[18]]),  # tie: no pair
    episode("g3", 0, 1.0, [[19, 20]]),  # alone: no pair
    episode("g4", 0, 0.0, [[21, 22]]),
    episode("g4", 1, 1.0, [[23, 24, 25]]),
]


def test_pairs_are_best_vs_worst_where_rewards_differ() -> None:
    batch = build_pair_batch(EPISODES, ContextConfig(), model_max_len=0)
    pairs = [(batch.episode_ids[c], batch.episode_ids[r]) for c, r in zip(batch.chosen, batch.rejected, strict=True)]
    assert pairs == [("g1-e1", "g1-e2"), ("g4-e1", "g4-e0")]
    assert batch.seq_tokens == [4, 1, 3, 2]
    assert batch.metrics["dpo/pairs"] == 2 and batch.metrics["dpo/groups"] == 4
    # a multi-call episode merges into one sample; every sample points at its sequence
    assert len(batch.samples) == 4 and batch.sample_seq == [0, 1, 2, 3]
    assert batch.samples[0].input_ids == PROMPT + [12, 13, 14, 5, 6, 15]
    assert batch.samples[0].loss_mask == [0, 0, 0, 0, 1, 1, 1, 0, 0, 1]


def test_sequence_logps_sum_entries_per_sequence() -> None:
    entries = torch.tensor([-1.0, -2.0, -0.5, -0.25, -4.0])
    seqs = torch.tensor([0, 1, 0, 2, 1])
    assert sequence_logps(entries, seqs, 4).tolist() == [-1.5, -6.0, -0.25, 0.0]


def test_ipo_uses_length_averaged_logps() -> None:
    batch = build_pair_batch(EPISODES, ContextConfig(), model_max_len=0)
    policy = torch.tensor([-8.0, -3.0, -6.0, -2.0])  # per token: -2, -3, -2, -1
    cfg = AlgorithmConfig(dpo_loss="ipo", dpo_beta=0.5, dpo_reference_free=True)
    loss, metrics = pair_loss(policy, None, batch, cfg)
    # logits: (-2) - (-3) = 1 and (-2) - (-1) = -1; IPO: (logit - 1/(2*0.5))^2 -> 0 and 4
    assert float(loss) == pytest.approx((0.0 + 4.0) / 2)
    assert metrics["dpo/accuracy"] == 0.5


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def manual_logps(model, batch) -> torch.Tensor:
    """Per paired episode: the summed log-probs of its trained tokens, from plain forwards."""
    out = [torch.zeros(()) for _ in batch.episode_ids]
    for sample, seq in zip(batch.samples, batch.sample_seq, strict=True):
        logp = torch.log_softmax(model(torch.tensor([sample.input_ids])).logits[0].float(), -1)
        for t, m in enumerate(sample.loss_mask):
            if m:
                out[seq] = out[seq] + logp[t - 1, sample.input_ids[t]]
    return torch.stack(out)


def test_packed_sequence_logps_are_summed_completion_logprobs(model) -> None:
    from ajet.dpo.step import pack_pairs

    batch = build_pair_batch(EPISODES, ContextConfig(), model_max_len=0)
    with torch.no_grad():
        expected = manual_logps(model, batch)
    for budget in (4096, 12, 0):
        got = packed_sequence_logps(model, pack_pairs(batch, budget), batch)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


class GradCapture:
    def __init__(self, model) -> None:
        self.model, self.grads = model, {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
def test_two_pass_update_has_the_one_batch_gradient(model, loss_type: str) -> None:
    from ajet.algorithms.reference import ReferencePolicy

    batch = build_pair_batch(EPISODES, ContextConfig(), model_max_len=0)
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    reference = ReferencePolicy(ref_model, "frozen")
    cfg = AlgorithmConfig(dpo_loss=loss_type, dpo_beta=0.5)

    model.zero_grad()
    with torch.no_grad():
        ref = manual_logps(ref_model, batch)
    loss, _ = pair_loss(manual_logps(model, batch), ref, batch, cfg)
    loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert any(g.abs().sum() > 0 for g in expected.values())

    for budget in (4096, 12):  # one packed sequence, then several micro-batches
        capture = GradCapture(model)
        metrics = dpo_step(OptimizerStep(model, capture, NO_CLIP), reference, batch, cfg, micro_batch_tokens=budget)
        assert metrics["dpo/loss"] == pytest.approx(float(loss.detach()), rel=1e-4)
        for name, grad in expected.items():
            torch.testing.assert_close(capture.grads[name], grad, rtol=1e-3, atol=1e-6)
    assert not model.training
