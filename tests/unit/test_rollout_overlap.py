"""One-step off-policy overlap (`rollout.max_staleness`): the next step's rollout starts during
the update, episodes beyond the staleness cap are not trained on, and the ones kept are trained
with the TIS ratio of the weights that sampled them."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from ajet.config.schema import AlgorithmConfig, ContextConfig, TrainerConfig
from ajet.context.pack import pack_samples
from ajet.rl.samples import build_step_batch
from ajet.rl.update import PolicyUpdater
from ajet.rollout.episode import FAILED, OK, Episode
from ajet.rollout.manager import RolloutResult
from ajet.rollout.overlap import OverlappedEpisodes
from ajet.rollout.staleness import keep_fresh
from ajet.training.optim import build_optimizer
from ajet.workflow import WorkflowTask
from tests.unit.test_rl_update import T, completion_logprobs, episode


def result_of(*episodes: Episode) -> RolloutResult:
    return RolloutResult(episodes=list(episodes), ok_episodes=[e for e in episodes if e.status == OK])


def plain(eid: str, versions: list[int]) -> Episode:
    return Episode(episode_id=eid, task=WorkflowTask(task_id="t"), group_id="t", policy_versions=versions)


def test_keep_fresh_drops_episodes_beyond_the_cap_and_reports_the_lag() -> None:
    eps = [plain("now", [5]), plain("one", [4, 5]), plain("two", [3, 4]), plain("none", [])]
    failed = plain("failed", [1])
    failed.status = FAILED
    result = keep_fresh(result_of(*eps, failed), version=5, max_staleness=1)
    assert [e.episode_id for e in result.ok_episodes] == ["now", "one", "none"]
    stale = eps[2]
    assert stale.status == FAILED and stale.reason == "stale" and "rollout.max_staleness=1" in stale.error_message
    assert failed.reason == ""  # already failed: not counted as stale
    assert result.extra_metrics["rollout/staleness_max"] == 1.0
    assert result.extra_metrics["rollout/staleness_mean"] == pytest.approx(1 / 3)
    assert result.metrics()["rollout/failed/stale"] == 1.0


class Source:
    """Counts the rollouts it starts; each takes a few loop turns and reports version `step`."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.cancelled: list[int] = []
        self.closed = False

    async def next_batch(self, step: int) -> RolloutResult:
        self.started.append(step)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled.append(step)
            raise
        return result_of(plain(f"s{step}", [step - 1]))

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_prefetched_step_is_not_rolled_out_again() -> None:
    inner = Source()
    version = {"v": 0}
    source = OverlappedEpisodes(inner, max_staleness=1, version=lambda: version["v"])
    loop = asyncio.new_event_loop()

    async def step_one_then_update() -> RolloutResult:
        first = await source.next_batch(1)
        source.prefetch(2)  # the update of step 1 would run in a worker thread now
        await asyncio.sleep(0)
        return first

    first = loop.run_until_complete(step_one_then_update())
    assert first.extra_metrics["rollout/prefetched"] == 0.0 and inner.started == [1, 2]
    version["v"] = 1  # the update of step 1 was published
    second = loop.run_until_complete(source.next_batch(2))
    assert inner.started == [1, 2]  # step 2 came from the prefetch
    assert second.extra_metrics["rollout/prefetched"] == 1.0
    assert second.extra_metrics["rollout/staleness_max"] == 0.0 and second.ok_episodes

    # A prefetch for a step that is never asked for is cancelled, at the next step or at close.
    loop.run_until_complete(_prefetch(source, 9))
    third = loop.run_until_complete(source.next_batch(3))
    assert inner.cancelled == [9] and third.extra_metrics["rollout/prefetched"] == 0.0
    loop.run_until_complete(_prefetch(source, 4))
    source.close()
    assert inner.cancelled == [9, 4] and inner.closed
    loop.close()


async def _prefetch(source: OverlappedEpisodes, step: int) -> None:
    source.prefetch(step)
    await asyncio.sleep(0)


def test_max_staleness_zero_is_not_an_overlap() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        OverlappedEpisodes(Source(), max_staleness=0, version=lambda: 0)


def test_kept_stale_episodes_train_with_the_tis_ratio_of_their_sampling_weights() -> None:
    """Hand-made versions: the trainer holds version 2; episodes were sampled by versions 2, 1
    and 0 (copies of the model with other weights). With max_staleness=1 the version-0 episode
    is dropped, and each kept token's loss weight is min(p_v2 / p_sampler, cap)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    current = LlamaForCausalLM(config).eval()
    versions = {2: current}
    for version, scale in ((1, 0.05), (0, 0.3)):
        older = copy.deepcopy(current)
        with torch.no_grad():
            for param in older.parameters():
                param.add_(torch.randn_like(param) * scale)
        versions[version] = older
    calls = {"e2": (2, [1, 2, 3], [4, 5, 6], 1.0), "e1": (1, [1, 2, 3], [7, 8], 0.0),
             "e0": (0, [1, 2, 3], [9, 10, 11], 0.5)}
    episodes, sampled = [], {}
    for eid, (version, prompt, completion, reward) in calls.items():
        with torch.no_grad():
            logprobs, _ = completion_logprobs(versions[version], prompt, completion)
        sampled[eid] = logprobs
        ep = episode(eid, "g", reward, [(prompt, completion, logprobs.tolist())])
        ep.policy_versions = [version]
        episodes.append(ep)
    result = keep_fresh(result_of(*episodes), version=2, max_staleness=1)
    assert [e.episode_id for e in result.ok_episodes] == ["e2", "e1"]

    cap = 1.5
    algo = AlgorithmConfig(tis_cap=cap)
    trainer = TrainerConfig(lr=0.0, grad_clip=1e9)
    updater = PolicyUpdater(current, build_optimizer(current, trainer)[0], trainer, algo, temperature=T)
    batch = build_step_batch(result.ok_episodes, ContextConfig(), algo, model_max_len=128)
    metrics = updater.update(pack_samples(batch.samples, batch.weights, 4096))
    ratios = []
    for eid in ("e2", "e1"):
        _, prompt, completion, _ = calls[eid]
        with torch.no_grad():
            now, _ = completion_logprobs(current, prompt, completion)
        ratios += (now - sampled[eid]).exp().clamp(max=cap).tolist()
    # token-mean: every kept token weighs 1/n of the step
    assert metrics["actor/tis_weight"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-4)
    assert any(abs(r - 1) > 0.01 for r in ratios)  # version 1's tokens are reweighted


def test_gpu_backbones_refuse_the_overlap(tmp_path) -> None:
    from ajet.backbones.registry import backbone_problems
    from ajet.config import load_config

    (tmp_path / "agent.py").write_text("class W: pass\n")
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    conf = tmp_path / "run.yaml"
    conf.write_text("workflow: {target: agent.py:W}\ntask_reader: {jsonl: {train_path: train.jsonl}}\n")
    cfg = load_config(conf, ["rollout.max_staleness=1", "rollout.engine_dtype=float16", "algorithm.tis_cap=2"])
    for backbone in ("trinity", "verl"):
        assert "runs on --backbone=debug only" in dict(backbone_problems(backbone, cfg))["rollout.max_staleness"]
