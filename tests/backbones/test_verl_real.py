"""The verl backbone against the real verl package (runs in `.venv-verl`: `make test-verl`;
`make test` runs it; skipped in an environment without verl).

What runs for real here, on a CPU: Hydra composing verl's own `ppo_trainer` config with the
overrides our driver writes; verl's `RLHFDataset` reading our parquet; verl's agent-loop
registry loading our `agent_loops.yaml` and `hydra.utils.instantiate` building our agent loop
with the arguments verl's worker passes; the loop running one ajet episode (workflow,
tracker, merge) into verl's `AgentLoopOutput`; verl's `DataProto` holding a padded batch.
What stands in: verl's server manager (`generate` -> `TokenOutput`, answered by ajet's
LocalEngine on a tiny model) in place of its vLLM servers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="runs in .venv-verl: make test-verl (part of make test)")



class StubServerManager:
    """verl's server manager interface (`await generate(...) -> TokenOutput`) on LocalEngine."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from ajet.engine.base import SamplingParams

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        assert sampling_params["logprobs"] is True  # what calculate_log_probs needs
        params = SamplingParams(temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
                                top_k=max(0, sampling_params["top_k"]), max_tokens=sampling_params["max_tokens"],
                                stop=list(sampling_params.get("stop", [])))
        [done] = await self.engine.generate(prompt_ids, params)
        return TokenOutput(token_ids=done.token_ids, log_probs=done.logprobs, stop_reason="completed",
                           extra_fields={"global_steps": 5})


@pytest.fixture()
def prepared(tmp_path: Path, two_calls_conf: Path) -> tuple[Any, Path]:
    """(verl's composed config, verl dir) as `ajet --backbone=verl` writes and verl reads them."""
    from hydra import compose, initialize_config_module

    from ajet.backbones.verl.driver import prepare
    from ajet.config import load_config

    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}"])
    overrides = prepare(cfg, resume=False)
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        composed = compose(config_name="ppo_trainer", overrides=overrides)
    return composed, (tmp_path / "exp" / "ajet" / "verl").resolve()


def test_verl_composes_our_overrides(prepared: tuple[Any, Path]) -> None:
    composed, out = prepared
    assert composed.actor_rollout_ref.rollout.n == 2
    assert composed.actor_rollout_ref.rollout.calculate_log_probs is True
    assert composed.actor_rollout_ref.rollout.agent.default_agent_loop == "ajet_agent"
    assert composed.data.train_files == str(out / "train.parquet")


def test_agent_loop_runs_an_episode_into_verl_outputs(prepared: tuple[Any, Path]) -> None:
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopOutput,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from ajet.backbones.gpu_worker import EpisodeRuntime
    from ajet.backbones.verl.agent_loop import AjetAgentLoop
    from ajet.backbones.verl.convert import task_from_extra_info
    from ajet.engine.local import LocalEngine
    from ajet.models.load import load_model_and_tokenizer

    composed, out = prepared
    rollout = composed.actor_rollout_ref.rollout
    # What verl's AgentLoopWorker does with agent_loop_config_path, then per trajectory.
    for entry in OmegaConf.load(rollout.agent.agent_loop_config_path):
        _agent_loop_registry[entry.name] = entry
    tokenizer = AutoTokenizer.from_pretrained(composed.actor_rollout_ref.model.path)
    dataset = RLHFDataset(data_files=composed.data.train_files, tokenizer=tokenizer, config=composed.data)
    row = dataset[1]
    task, config_path = task_from_extra_info(row["extra_info"])
    assert task.task_id == "t1" and row["agent_name"] == rollout.agent.default_agent_loop

    from ajet.config import load_config

    model, _ = load_model_and_tokenizer(load_config(config_path).model)
    engine = LocalEngine(model, tokenizer, max_batch_size=2, max_model_len=2048)
    server = StubServerManager(engine)
    try:
        loop = instantiate(config=_agent_loop_registry[row["agent_name"]],
                           trainer_config=DictConfigWrap(config=composed), server_manager=server,
                           tokenizer=tokenizer, processor=None, hf_model_type="llama",
                           dataset_cls=RLHFDataset, data_config=DictConfigWrap(composed.data),
                           tools=ToolListWrap([]))
        assert isinstance(loop, AjetAgentLoop)
        sampling = {"temperature": rollout.temperature, "top_p": rollout.top_p, "top_k": rollout.top_k,
                    "repetition_penalty": 1.0, "logprobs": rollout.calculate_log_probs}
        kwargs = {k: v for k, v in row.items() if not isinstance(v, torch.Tensor)}
        outputs = asyncio.run(loop.run(sampling, **kwargs))
        chat_prompt = loop.chat_prompt_ids(row["raw_prompt"])  # an untrained stand-in's prompt
    finally:
        for runtime in EpisodeRuntime._instances.values():
            runtime.close()
        EpisodeRuntime._instances.clear()
        engine.close()

    [output] = outputs  # an ok episode: one output (a failed one returns none)
    assert chat_prompt and all(isinstance(t, int) for t in chat_prompt)
    assert tokenizer.decode(chat_prompt).rstrip().endswith("assistant")  # ends with the generation prompt
    assert isinstance(output, AgentLoopOutput)
    assert len(server.calls) == 2 and server.calls[0]["sampling_params"]["max_tokens"] == 6
    assert output.prompt_ids == server.calls[0]["prompt_ids"]  # the prompt ends where training starts
    whole = output.prompt_ids + output.response_ids
    assert whole[: len(server.calls[1]["prompt_ids"])] == server.calls[1]["prompt_ids"]  # one merged sequence
    mask = output.response_mask
    first_len = len(server.calls[1]["prompt_ids"]) - len(output.prompt_ids)
    assert mask[0] == 1 and 0 in mask[:first_len] and mask[first_len] == 1  # the "More." turn untrained
    assert len(mask) == len(output.response_ids) == len(output.response_logprobs)
    assert all(lp < 0 for lp, m in zip(output.response_logprobs, mask, strict=True) if m)
    assert output.reward_score == 0.25 and output.num_turns == 4
    assert output.extra_fields["ajet_stand_in"] == 0 and output.extra_fields["ajet/workflow/turns"] == 2.0
    assert len(output.prompt_ids) <= rollout.prompt_length and len(mask) <= rollout.response_length

    as_dict = output.as_dict()  # verl's own tensor conversion of the loop output
    assert as_dict["response_mask"].tolist() == mask
    assert torch.allclose(as_dict["rollout_log_probs"], torch.tensor(output.response_logprobs))
