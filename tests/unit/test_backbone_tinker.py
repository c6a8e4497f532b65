"""The tinker backbone's pure parts: samples as datums, the loss config, the sampler's params and
outputs, and the refusals of what a Tinker service cannot train."""

from __future__ import annotations

import pytest

from ajet.backbones.registry import backbone_problems
from ajet.backbones.tinker.datums import RemoteDatum, logprob_mismatch, loss_config, remote_datums
from ajet.backbones.tinker.engine import sequence_to_completion, tinker_sampling
from ajet.backbones.tinker.remote import lora_targets
from ajet.config.schema import AjetConfig
from ajet.context.types import Sample
from ajet.engine.base import SamplingParams
from ajet.errors import InfrastructureError


def test_a_sample_becomes_a_shifted_datum_with_weighted_advantages() -> None:
    sample = Sample(input_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], old_logprobs=[0.0, -9.0, -0.5, -0.25],
                    advantage=[2.0, 2.0, 2.0, 2.0])
    untrained = Sample(input_ids=[1, 2], loss_mask=[0, 0], old_logprobs=[0.0, 0.0], advantage=[1.0, 1.0])
    (datum,) = remote_datums([sample, untrained], [[0.0, 0.0, 0.5, 0.25], [0.0, 0.0]])
    assert datum == RemoteDatum(model_input=[5, 6, 7], target_tokens=[6, 7, 8], logprobs=[0.0, -0.5, -0.25],
                                advantages=[0.0, 1.0, 0.5])
    with pytest.raises(ValueError, match="differ in length"):
        remote_datums([sample], [[1.0]])


def test_the_loss_config_is_the_algorithms_clip_range() -> None:
    cfg = AjetConfig()
    cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high = 0.2, 0.28
    assert loss_config("ppo", cfg.algorithm) == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    assert loss_config("importance_sampling", cfg.algorithm) is None
    with pytest.raises(ValueError, match="cispo"):
        loss_config("cispo", cfg.algorithm)


def test_logprob_mismatch_reads_trained_tokens_only() -> None:
    sent = [RemoteDatum([1, 2], [2, 3], [0.0, -1.0], [0.0, 1.0])]
    assert logprob_mismatch(sent, [[-7.0, -1.5]]) == {"rollout/logprob_mismatch": 0.5,
                                                       "rollout/logprob_mismatch_max": 0.5}


def test_sampling_params_and_sequences() -> None:
    params = SamplingParams(temperature=1.0, top_k=0, max_tokens=5, stop=["\n"], seed=3)
    assert tinker_sampling(params) == {"max_tokens": 5, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                       "stop": ["\n"], "seed": 3}
    with pytest.raises(ValueError, match="logprob_temperature"):
        tinker_sampling(SamplingParams(temperature=0.7, logprob_temperature=1.0))
    done = sequence_to_completion([4, 2], [-0.1, -0.2], "length", policy_version=3)
    assert (done.token_ids, done.finish_reason, done.policy_version) == ([4, 2], "length", 3)
    with pytest.raises(InfrastructureError, match="no logprobs"):
        sequence_to_completion([4], None, "stop", policy_version=0)


def test_lora_targets_are_whole_groups() -> None:
    assert lora_targets(["q_proj", "k_proj", "v_proj", "o_proj"]) == {"train_attn": True, "train_mlp": False,
                                                                      "train_unembed": False}
    assert lora_targets(["q_proj", "v_proj"]) is None
    assert lora_targets(["gate_proj", "up_proj", "down_proj", "lm_head"]) == {
        "train_attn": False, "train_mlp": True, "train_unembed": True}


def test_what_a_tinker_service_cannot_train_is_refused_by_name() -> None:
    cfg = AjetConfig()
    problems = dict(backbone_problems("tinker", cfg))
    assert "full fine-tune" in problems["model.lora.enabled"]
    assert "tinker.base_model" in problems
    cfg.model.lora.enabled, cfg.tinker.base_model = True, "m"
    assert backbone_problems("tinker", cfg) == []
    cfg.algorithm.kl_coef, cfg.rollout.temperature, cfg.rollout.max_staleness = 0.1, 0.7, 1
    cfg.algorithm.name = "distill"
    problems = dict(backbone_problems("tinker", cfg))
    assert {"algorithm.kl_coef", "rollout.temperature", "rollout.max_staleness", "algorithm.name"} <= set(problems)
    assert "does not run on --backbone=tinker" in problems["algorithm.name"]
    # its section on another backbone has no effect there, and says so
    debug = AjetConfig()
    debug.tinker.base_model = "m"
    assert "is a tinker setting" in dict(backbone_problems("debug", debug))["tinker.base_model"]
