"""The RL update against hand-written references (issue 14): GRPO advantages, the PPO clip,
the k3 KL, the entropy bonus and the token weights give the gradient that plain per-sample
forwards give; the LR schedule; the direction of a step; episodes -> samples."""

from __future__ import annotations

import copy
import math
import statistics

import pytest
import torch

from ajet.config.schema import AlgorithmConfig, ContextConfig, TrainerConfig
from ajet.context.pack import pack_samples
from ajet.context.types import Timeline
from ajet.rl.samples import build_step_batch
from ajet.rl.update import PolicyUpdater
from ajet.rollout.episode import Episode
from ajet.training.optim import build_optimizer, lr_factor
from ajet.workflow import WorkflowTask

T = 0.8  # sampling temperature: log-probs, entropy and KL are all of the tempered policy


@pytest.fixture()
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def episode(eid: str, group: str, reward: float, calls: list[tuple[list[int], list[int], list[float]]],
            role: str = "default", trainable: bool = True) -> Episode:
    """One timeline per call, as the tracker records them: call k's tokens are the whole history
    so far plus `prompt_k + completion_k`; only its own completion is trainable."""
    timelines, history = [], []
    for k, (prompt, completion, logprobs) in enumerate(calls):
        start = len(history) + len(prompt)
        history = history + prompt + completion
        n = len(history)
        timelines.append(Timeline(
            timeline_id=k, role=role, token_ids=list(history),
            trainable=[trainable and start <= i for i in range(n)],
            logprobs=[0.0] * start + list(logprobs), call_indices=[k], completion_spans=[(start, n)]))
    return Episode(episode_id=eid, task=WorkflowTask(task_id=group), group_id=group, reward=reward,
                   timelines=timelines)


def completion_logprobs(model, prompt: list[int], completion: list[int], temperature: float = T):
    """Plain forward of one sequence: log-probs and entropies at the completion tokens."""
    logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    new = logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
    return new, -(logp.exp() * logp).sum(-1)


def capture_grads(optimizer, monkeypatch) -> dict[str, list[torch.Tensor]]:
    """Record the gradients each optimizer step sees, then take the real step."""
    seen: dict[str, list[torch.Tensor]] = {"grads": [], "lr": []}
    step = optimizer.step

    def recording_step(*args, **kwargs):
        seen["grads"].append([p.grad.clone() for p in optimizer.param_groups[0]["params"]])
        seen["lr"].append(optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    monkeypatch.setattr(optimizer, "step", recording_step)
    return seen


# (group, reward, prompt, completion, log(ratio) per token): old = current - log(ratio).
# Advantages: g1 ~ [+1.12, -0.80, -0.32], g2 = [+0.71, -0.71]. With clip low 0.2 / high 0.28,
# exp(0.23) = 1.26 is clipped only if high and low were swapped, exp(-0.24) = 0.79 only if not.
COMPLETIONS = [
    ("g1", 1.0, [1, 2, 3, 4], [5, 6, 7], [0.5, 0.23, 0.05]),  # A > 0: clipped, in, in
    ("g1", 0.0, [1, 2, 3, 4], [8, 9], [-0.5, -0.24]),  # A < 0: clipped, clipped
    ("g1", 0.25, [1, 2, 3, 4], [10, 11, 12], [0.3, -0.05, -0.3]),  # A < 0: in, in, clipped
    ("g2", 2.0, [20, 21, 22], [23, 24], [0.4, -0.4]),  # A > 0: clipped, in
    ("g2", -1.0, [20, 21, 22], [25, 26, 27], [0.1, -0.1, 0.0]),  # A < 0: in
]


def hand_advantages() -> list[float]:
    by_group: dict[str, list[float]] = {}
    for group, reward, *_ in COMPLETIONS:
        by_group.setdefault(group, []).append(reward)
    # GRPO as ajet defines it: (r - mean) / (std + 1e-6), unbiased (n - 1) std, per group
    return [(r - statistics.mean(by_group[g])) / (statistics.stdev(by_group[g]) + 1e-6)
            for g, r, *_ in COMPLETIONS]


@pytest.mark.parametrize("loss_agg, max_tokens", [("token_mean", 4096), ("seq_mean", 0)])
def test_update_gradient_equals_hand_written_loss(model, monkeypatch, loss_agg: str, max_tokens: int) -> None:
    algo = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, kl_coef=0.5, entropy_coef=0.1)
    # lr 0: the step leaves the weights as they were, for the reference forwards below
    trainer = TrainerConfig(lr=0.0, grad_clip=1e9)
    updater = PolicyUpdater(model, build_optimizer(model, trainer)[0], trainer, algo, temperature=T)
    reference = copy.deepcopy(model)  # the initial weights, as the updater's frozen reference
    torch.manual_seed(1)
    with torch.no_grad():  # move the policy away from the reference so the KL has a gradient
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    model.train()

    episodes, olds = [], []
    for i, (group, reward, prompt, completion, log_ratio) in enumerate(COMPLETIONS):
        with torch.no_grad():
            current, _ = completion_logprobs(model, prompt, completion)
        olds.append(current - torch.tensor(log_ratio))
        episodes.append(episode(f"e{i}", group, reward, [(prompt, completion, olds[-1].tolist())]))
    batch = build_step_batch(episodes, ContextConfig(loss_agg=loss_agg), algo, model_max_len=128)
    seen = capture_grads(updater.optimizer, monkeypatch)
    metrics = updater.update(pack_samples(batch.samples, batch.weights, max_tokens))
    assert not model.training

    model.zero_grad()
    model.train()
    n_tokens = sum(len(c[3]) for c in COMPLETIONS)
    loss, kl_total, clipped = 0.0, 0.0, 0
    for (_, _, prompt, completion, _), adv, old in zip(COMPLETIONS, hand_advantages(), olds, strict=True):
        new, entropy = completion_logprobs(model, prompt, completion)
        with torch.no_grad():
            ref, _ = completion_logprobs(reference, prompt, completion)
        # token_mean: every trained token of the step weighs the same; seq_mean: every call does
        weight = 1 / n_tokens if loss_agg == "token_mean" else 1 / (len(COMPLETIONS) * len(completion))
        ratio = torch.exp(new - old)
        surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - 0.2, 1 + 0.28))
        kl = torch.exp(ref - new) - (ref - new) - 1  # k3 estimate of KL(policy || reference)
        loss = loss + weight * (surrogate + 0.5 * kl - 0.1 * entropy).sum()
        kl_total += float(weight * kl.sum())
        clipped += int(((ratio > 1.28) & (adv > 0) | (ratio < 0.8) & (adv < 0)).sum())
    loss.backward()

    assert 0 < clipped < n_tokens  # both sides of the clip are exercised
    assert metrics["actor/loss"] == pytest.approx(float(loss), rel=1e-4)
    assert metrics["actor/kl"] == pytest.approx(kl_total, rel=1e-4)
    (grads,) = seen["grads"]
    for got, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("tis_cap", [0.0, 1.3])
def test_logprob_mismatch_metric_and_tis_gradient(model, monkeypatch, tis_cap: float) -> None:
    """The engine's logprobs (`old`) differ from the trainer's by log_ratio per token: the
    update logs the mean |difference|, and with TIS weights each token's gradient by
    min(exp(trainer - engine), cap) with the PPO ratio taken against the trainer's logprobs."""
    algo = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, tis_cap=tis_cap)
    trainer = TrainerConfig(lr=0.0, grad_clip=1e9)
    updater = PolicyUpdater(model, build_optimizer(model, trainer)[0], trainer, algo, temperature=T)
    model.train()
    episodes, engine = [], []
    for i, (group, reward, prompt, completion, log_ratio) in enumerate(COMPLETIONS):
        with torch.no_grad():
            current, _ = completion_logprobs(model, prompt, completion)
        engine.append(current - torch.tensor(log_ratio))
        episodes.append(episode(f"e{i}", group, reward, [(prompt, completion, engine[-1].tolist())]))
    batch = build_step_batch(episodes, ContextConfig(), algo, model_max_len=128)
    seen = capture_grads(updater.optimizer, monkeypatch)
    metrics = updater.update(pack_samples(batch.samples, batch.weights, 4096))

    diffs = [abs(x) for c in COMPLETIONS for x in c[4]]
    assert metrics["rollout/logprob_mismatch"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-5)
    assert metrics["rollout/logprob_mismatch_max"] == pytest.approx(0.5, abs=1e-5)
    model.zero_grad()
    model.train()
    n_tokens = sum(len(c[3]) for c in COMPLETIONS)
    loss = 0.0
    for (_, _, prompt, completion, log_ratio), adv, old in zip(COMPLETIONS, hand_advantages(), engine, strict=True):
        new, _ = completion_logprobs(model, prompt, completion)
        if tis_cap:  # ratio 1 in value (never clipped), each token weighed by its capped ratio
            weights = torch.tensor(log_ratio).exp().clamp(max=tis_cap)
            per_token = -adv * torch.exp(new - new.detach()) * weights
        else:
            ratio = torch.exp(new - old)
            per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - 0.2, 1 + 0.28))
        loss = loss + (per_token / n_tokens).sum()
    loss.backward()
    assert metrics["actor/loss"] == pytest.approx(float(loss), rel=1e-4)
    if tis_cap:
        assert 0 < metrics["actor/tis_weight"] < tis_cap
    (grads,) = seen["grads"]
    for got, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-7)


COS_1_4, COS_3_4 = 0.8535533905932737, 0.14644660940672624  # (1 + cos(pi/4)) / 2, (1 + cos(3pi/4)) / 2


@pytest.mark.parametrize("schedule, warmup, total, factors", [
    ("constant", 2, 6, [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", 2, 6, [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),
    ("cosine", 2, 6, [0.5, 1.0, 1.0, COS_1_4, 0.5, COS_3_4, 0.0, 0.0]),
    ("linear", 0, 4, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),
    ("cosine", 0, 4, [1.0, COS_1_4, 0.5, COS_3_4, 0.0, 0.0]),
])
def test_schedule_factor_at_each_step(model, schedule: str, warmup: int, total: int, factors: list[float]) -> None:
    cfg = TrainerConfig(lr=0.1, warmup_steps=warmup, total_steps=total, lr_schedule=schedule)
    optimizer, scheduler = build_optimizer(model, cfg)
    got = []
    for _ in factors:
        got.append(optimizer.param_groups[0]["lr"] / 0.1)
        optimizer.step()
        scheduler.step()
    assert got == pytest.approx(factors, abs=1e-9)


def on_policy_pair(model, prompt, good, bad) -> list[Episode]:
    """One group: `good` (reward 1, advantage +0.71) and `bad` (reward 0, advantage -0.71)."""
    with torch.no_grad():
        return [episode(name, "g", reward, [(prompt, c, completion_logprobs(model, prompt, c, 1.0)[0].tolist())])
                for name, reward, c in (("good", 1.0, good), ("bad", 0.0, bad))]


def test_ppo_epochs_step_the_optimizer_per_epoch_and_leave_the_schedule_to_the_loop(model, monkeypatch) -> None:
    cfg = TrainerConfig(lr=0.1, warmup_steps=2, total_steps=4, lr_schedule="linear", ppo_epochs=2)
    optimizer, scheduler = build_optimizer(model, cfg)
    updater = PolicyUpdater(model, optimizer, cfg, AlgorithmConfig(), temperature=1.0)
    seen = capture_grads(optimizer, monkeypatch)
    batch = build_step_batch(on_policy_pair(model, [1, 2, 3], [4, 5], [6, 7]), ContextConfig(),
                             AlgorithmConfig(), model_max_len=128)
    packed = pack_samples(batch.samples, batch.weights, 4096)
    for _ in range(4):
        updater.update(packed)
        scheduler.step()  # what TrainingLoop does once per training step
    # factors 0.5, 1, 1, 0.5 for steps 0..3, each used by both PPO epochs of its update
    assert seen["lr"] == pytest.approx([0.05, 0.05, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    assert scheduler.last_epoch == 4
    assert [lr_factor(step, cfg) for step in range(4)] == pytest.approx([0.5, 1.0, 1.0, 0.5])


def test_step_raises_positive_and_lowers_negative_advantage_logprob(model) -> None:
    prompt, good, bad = [1, 2, 3, 4], [5, 6, 7], [8, 9, 10]
    trainer = TrainerConfig(lr=1e-3)
    updater = PolicyUpdater(model, build_optimizer(model, trainer)[0], trainer, AlgorithmConfig(), temperature=1.0)
    episodes = on_policy_pair(model, prompt, good, bad)
    before = [float(sum(e.timelines[0].logprobs)) for e in episodes]
    batch = build_step_batch(episodes, ContextConfig(), AlgorithmConfig(), model_max_len=128)
    assert [s.advantage[-1] for s in batch.samples] == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)], rel=1e-5)
    packed = pack_samples(batch.samples, batch.weights, 4096)
    for _ in range(3):
        updater.update(packed)
        assert all(p.grad is None for p in model.parameters())  # spent after the step: freed
    with torch.no_grad():
        after = [float(completion_logprobs(model, prompt, c, 1.0)[0].sum()) for c in (good, bad)]
    assert after[0] > before[0]
    assert after[1] < before[1]


def test_build_step_batch_advantages_masks_and_weights_by_hand() -> None:
    p, u = [1, 2, 3], [30, 31]  # a prompt; a user turn between two calls (never trained)
    episodes = [  # g1: rewards 1, 0, 0.5 -> mean 0.5, unbiased std 0.5; g2: 0, 3 -> std 2.12
        episode("e0", "g1", 1.0, [(p, [4, 5], [-0.1, -0.2]), (u, [6, 7], [-0.3, -0.4])]),
        episode("e1", "g1", 0.0, [(p, [8, 9], [-0.5, -0.6])]),
        episode("e2", "g1", 0.5, [(p, [10, 11], [-0.7, -0.8])]),
        episode("e2", "g1", 0.5, [([12], [13], [-0.9])], role="judge", trainable=False),
        episode("e3", "g2", 0.0, [([20], [21, 22, 23], [-1.0, -1.1, -1.2])]),
        episode("e4", "g2", 3.0, [([20], [24], [-1.3])]),
    ]
    # the judge's untrained call is an extra timeline of e2, not an extra episode
    episodes[2].timelines.append(episodes.pop(3).timelines[0])
    batch = build_step_batch(episodes, ContextConfig(), AlgorithmConfig(), model_max_len=128)

    adv = {"e0": 1.0, "e1": -1.0, "e2": 0.0, "e3": -math.sqrt(0.5), "e4": math.sqrt(0.5)}
    expected = [  # (episode, input_ids, loss mask): e0's two calls merged into one sample
        ("e0", p + [4, 5] + u + [6, 7], [0, 0, 0, 1, 1, 0, 0, 1, 1]),
        ("e1", p + [8, 9], [0, 0, 0, 1, 1]),
        ("e2", p + [10, 11], [0, 0, 0, 1, 1]),
        ("e3", [20, 21, 22, 23], [0, 1, 1, 1]),
        ("e4", [20, 24], [0, 1]),
    ]
    assert [(s.episode_id, s.input_ids, s.loss_mask) for s in batch.samples] == expected
    for s, (eid, _, mask) in zip(batch.samples, expected, strict=True):
        assert s.advantage == pytest.approx([adv[eid] * m for m in mask], rel=1e-5, abs=1e-12)
    assert batch.samples[0].old_logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4])
    assert batch.samples[0].token_call_ids == [-1, -1, -1, 0, 0, -1, -1, 1, 1]
    assert batch.weights == [[m / 12 for m in mask] for _, _, mask in expected]  # token_mean: 12 tokens

    seq = build_step_batch(episodes, ContextConfig(loss_agg="seq_mean"), AlgorithmConfig(), model_max_len=128)
    # seq_mean: 6 calls weigh 1/6 each, spread over their tokens (2, 2, 2, 2, 3 and 1 tokens)
    per_token = {"e0": 1 / 12, "e1": 1 / 12, "e2": 1 / 12, "e3": 1 / 18, "e4": 1 / 6}
    for w, (eid, _, mask) in zip(seq.weights, expected, strict=True):
        assert w == pytest.approx([per_token[eid] * m for m in mask])


def test_build_step_batch_counts_each_samples_break_by_name() -> None:
    """A sample after an episode's first names why it is separate (merge.BREAKS); the step
    counts them under context/breaks/<name>, spaces as underscores; the first sample is none."""
    first = episode("e0", "g1", 1.0, [([1, 2], [3, 4], [-0.1, -0.2])])
    rewritten = episode("e0", "g1", 1.0, [([5, 6], [7], [-0.3])]).timelines[0]
    rewritten.timeline_id, rewritten.call_indices, rewritten.fork_cause = 1, [1], "history_rewritten"
    changed = episode("e0", "g1", 1.0, [([8], [9], [-0.4])]).timelines[0]
    changed.timeline_id, changed.call_indices, changed.fork_cause = 2, [2], "tools_changed"
    first.timelines += [rewritten, changed]
    batch = build_step_batch([first], ContextConfig(), AlgorithmConfig(), model_max_len=128)
    assert [s.metadata["break"] for s in batch.samples] == ["", "rewrite", "tools changed"]
    breaks = {k: v for k, v in batch.metrics.items() if k.startswith("context/breaks/")}
    assert breaks == {"context/breaks/rewrite": 1.0, "context/breaks/tools_changed": 1.0}
