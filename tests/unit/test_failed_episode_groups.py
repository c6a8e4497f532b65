"""A failed episode leaves its GRPO group on every backbone (issue 25 §5.3).

One hand-made group: four episodes of task t1 with rewards 1, 0, 1 and one failed episode (it
made a call before its workflow raised). Each backbone's own path from episodes to training
data runs on it: debug (RolloutManager -> ok_episodes -> build_step_batch, as its RL step does),
trinity and verl (EpisodeRuntime.run in the backbone's worker -> the adapter's conversion). On
each, the failed episode contributes no trained token, and the ok episodes' advantages are
GRPO's over the rewards 1, 0, 1 alone, worked out by hand:

    mean 2/3; unbiased std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3)
    reward 1: (1 - 2/3) / sqrt(1/3) = 1/sqrt(3) = 0.5774
    reward 0: (0 - 2/3) / sqrt(1/3) = -2/sqrt(3) = -1.1547

(had the failed episode counted as a reward 0, as verl's stand-in did, they would be +-0.866).

trinity and verl compute advantages themselves, grouping whatever the adapter emits: by task
and run (trinity's step-wise GRPO), by uid = prompt (verl). Here those groups are formed from
what the adapters emit and their GRPO worked out with ajet's estimator (the same formula); the
tests that call trinity's and verl's own advantage functions need the real packages and run in
their environments (`make test-trinity`, `make test-verl`), skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from ajet.algorithms.grpo import grpo_advantages
from ajet.backbones.gpu_worker import EpisodeRuntime
from ajet.backbones.trinity.convert import episode_experience_fields
from ajet.backbones.verl.convert import episode_outputs, task_to_verl_row
from ajet.config.schema import AjetConfig
from ajet.context.types import Timeline
from ajet.rl.samples import build_step_batch
from ajet.rollout.episode import FAILED, Episode
from ajet.rollout.manager import RolloutManager
from ajet.workflow import WorkflowTask

REWARDS = [1.0, 0.0, 1.0, None]  # None: the workflow raised after one call
EXPECTED = {1.0: 1 / math.sqrt(3), 0.0: -2 / math.sqrt(3)}
TASK = WorkflowTask(task_id="t1", main_query="2+2?")
PROMPT = [1, 2, 3]  # the chat prompt's tokens, shared by the group


def make_episode(k: int, episode_id: str, group_id: str) -> Episode:
    """Episode k of the group: one call, prompt PROMPT, two trained completion tokens."""
    tokens = [*PROMPT, 10 + k, 20 + k]
    call = Timeline(0, "default", tokens, [False, False, False, True, True], [0.0, 0.0, 0.0, -0.5, -0.7],
                    [0], [(3, 5)])
    episode = Episode(episode_id=episode_id, task=TASK, group_id=group_id, timelines=[call], num_calls=1)
    if REWARDS[k] is None:
        episode.status, episode.reason = FAILED, "workflow_error:RuntimeError"
        episode.error_message = "RuntimeError: the tool broke"
    else:
        episode.reward, episode.is_success = REWARDS[k], REWARDS[k] > 0
    return episode


class GroupRunner:
    """A TaskRunner whose k-th episode is `make_episode(k)`, whatever its id."""

    def __init__(self) -> None:
        self.calls = 0

    async def run_episode(self, task: WorkflowTask, episode_id: str, group_id: str) -> Episode:
        k, self.calls = self.calls, self.calls + 1
        return make_episode(k, episode_id, group_id)


def worker_runtime(cfg: AjetConfig) -> EpisodeRuntime:
    """The rollout stack of a trinity / verl worker process, its runner answering from the group."""
    runtime = EpisodeRuntime.__new__(EpisodeRuntime)  # without its engine, gateway and workflow
    runtime.cfg, runtime.runner = cfg, GroupRunner()
    runtime.model_max_len = cfg.context.max_model_len or cfg.context.max_sample_tokens
    return runtime


def group_runs(cfg: AjetConfig) -> list[tuple[Episode, list[Any], dict[str, float]]]:
    """What EpisodeRuntime.run gives a GPU worker for each episode of the group."""
    runtime = worker_runtime(cfg)

    async def run_all() -> list[tuple[Episode, list[Any], dict[str, float]]]:
        return [await runtime.run(TASK, f"t1-e{k}", group_id="t1") for k in range(len(REWARDS))]

    return asyncio.run(run_all())


def test_debug_backbone_trains_the_ok_episodes_against_each_other() -> None:
    cfg = AjetConfig()
    cfg.rollout.n = len(REWARDS)
    result = asyncio.run(RolloutManager(GroupRunner(), cfg.rollout).rollout([TASK]))
    assert [e.ok for e in result.episodes] == [True, True, True, False]

    batch = build_step_batch(result.ok_episodes, cfg.context, cfg.algorithm, model_max_len=4096)
    failed_id = result.episodes[3].episode_id
    assert [s.episode_id for s in batch.samples] == [e.episode_id for e in result.episodes[:3]]
    assert failed_id not in {s.episode_id for s in batch.samples}  # no trained token from it
    for sample in batch.samples:
        trained = [a for a, m in zip(sample.advantage, sample.loss_mask, strict=True) if m]
        assert trained == pytest.approx([EXPECTED[sample.reward]] * 2, abs=1e-5)


def test_trinity_emits_no_experience_for_a_failed_run() -> None:
    runs = [episode_experience_fields(samples, metrics) for _, samples, metrics in group_runs(AjetConfig())]
    assert [len(r) for r in runs] == [1, 1, 1, 0]  # the failed run: no experience, no trained token
    # Trinity's step-wise GRPO groups a task's experiences by run; a run's last step carries its reward.
    group = [r[-1]["reward"] for r in runs if r]
    assert group == [1.0, 0.0, 1.0]
    advantages = grpo_advantages(group, ["t1"] * len(group))
    assert advantages == pytest.approx([EXPECTED[r] for r in group], abs=1e-5)
    for run in runs[:3]:
        assert sum(run[0]["action_mask"]) == 2


def verl_outputs(cfg: AjetConfig) -> list[list[dict[str, Any]]]:
    return [episode_outputs(episode, samples, max_prompt_length=16, max_response_length=16,
                            stand_in_prompt=lambda: list(PROMPT), eos_token_id=2)
            for episode, samples, _ in group_runs(cfg)]


def test_verl_emits_no_output_for_a_failed_trajectory() -> None:
    outputs = verl_outputs(AjetConfig())
    assert [len(o) for o in outputs] == [1, 1, 1, 0]  # the failed trajectory: no output, no trained token
    # verl's GRPO groups every output of a prompt (its uid): here the four trajectories of t1.
    group = [row["reward_score"] for rows in outputs for row in rows]
    assert group == [1.0, 0.0, 1.0]
    advantages = grpo_advantages(group, ["t1"] * len(group))
    assert advantages == pytest.approx([EXPECTED[r] for r in group], abs=1e-5)
    for rows in outputs[:3]:
        assert rows[0]["prompt_ids"] == PROMPT and sum(rows[0]["response_mask"]) == 2


def test_verl_stand_in_for_an_ok_episode_without_trained_tokens_keeps_its_reward() -> None:
    """An ok episode that trained nothing (e.g. only untrained roles called) stays in its group
    with its own reward, as on the debug backbone, and still trains nothing."""
    episode = make_episode(0, "t1-e0", "t1")
    [row] = episode_outputs(episode, [], max_prompt_length=2, max_response_length=16,
                            stand_in_prompt=lambda: list(PROMPT), eos_token_id=2)
    assert row["reward_score"] == 1.0 and row["response_mask"] == [0] and row["response_ids"] == [2]
    assert row["prompt_ids"] == [2, 3]  # cut to max_prompt_length from the left, as verl does


# ---------------------------------------------------------------------- the packages' own GRPO
def test_trinity_step_wise_grpo_leaves_the_failed_run_out() -> None:
    """Runs in .venv-trinity: the Experiences our workflow plugin returns, numbered as Trinity's
    runner numbers them, through Trinity's own step-wise GRPO."""
    pytest.importorskip("trinity", reason="runs in .venv-trinity: make test-trinity (part of make test)")
    from trinity.algorithm.advantage_fn.multi_step_grpo_advantage import StepWiseGRPOAdvantageFn

    from ajet.backbones.trinity.convert import to_experiences

    experiences = []
    for run, (_, samples, metrics) in enumerate(group_runs(AjetConfig())):
        for exp in to_experiences(episode_experience_fields(samples, metrics)):
            exp.eid.task, exp.eid.run = "0", run  # what WorkflowRunner.run_task sets
            experiences.append(exp)
    out, _ = StepWiseGRPOAdvantageFn()(experiences)
    assert sorted(e.eid.run for e in out) == [0, 1, 2]
    for exp in out:
        trained = exp.advantages[exp.action_mask.bool()].tolist()
        assert trained == pytest.approx([EXPECTED[exp.reward]] * 2, abs=1e-5)


def test_verl_grpo_over_the_agent_loop_outputs_leaves_the_failed_trajectory_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in .venv-verl: our agent loop's `run` for each trajectory of the group, its outputs
    keyed and batched as verl's v1 trainer does (`{uid}_{session}_{index}`), then verl's own
    advantage step (`compute_advantage_for_multi_trajectories`, GRPO by uid)."""
    # minversion: .venv-trinity holds trinity-rft's own verl 0.8, which the verl backbone does not run on.
    pytest.importorskip("verl", minversion="0.9", reason="runs in .venv-verl: make test-verl (part of make test)")
    import numpy as np
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from ajet.backbones.verl import agent_loop as agent_loop_module

    class Tokenizer:
        eos_token_id = 2

        def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> list[int]:
            return list(PROMPT)

    runtime = worker_runtime(AjetConfig())
    monkeypatch.setattr(agent_loop_module.EpisodeRuntime, "shared", lambda *a, **k: runtime)
    loop = agent_loop_module.AjetAgentLoop.__new__(agent_loop_module.AjetAgentLoop)
    loop.tokenizer, loop.prompt_length, loop.response_length = Tokenizer(), 16, 16
    row = task_to_verl_row(TASK, index=0, split="train", config_path="/run/config.yaml")

    keys, outputs = [], []
    for session in range(len(REWARDS)):
        result = asyncio.run(loop.run({}, extra_info=row["extra_info"], raw_prompt=row["prompt"], index=0))
        for i, output in enumerate(result if isinstance(result, list) else [result]):
            keys.append(f"uid7_{session}_{i}")
            outputs.append(output)
    assert [k.split("_")[1] for k in keys] == ["0", "1", "2"]  # the failed session put nothing

    width = max(len(o.response_ids) for o in outputs)
    mask = torch.zeros((len(outputs), width), dtype=torch.long)
    scores = torch.zeros((len(outputs), width))
    for i, o in enumerate(outputs):
        mask[i, : len(o.response_mask)] = torch.tensor(o.response_mask)
        scores[i, len(o.response_ids) - 1] = o.reward_score  # verl's rm_scores: the last response token
    data = DataProto.from_dict(tensors={"response_mask": mask, "token_level_rewards": scores},
                               non_tensors={"uid": np.array(["uid7"] * len(outputs), dtype=object)})
    data = compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator=AdvantageEstimator.GRPO,
                                                    num_repeat=len(REWARDS), norm_adv_by_std_in_grpo=True)
    for i, o in enumerate(outputs):
        trained = data.batch["advantages"][i][mask[i].bool()].tolist()
        assert trained == pytest.approx([EXPECTED[o.reward_score]] * int(mask[i].sum()), abs=1e-5)
