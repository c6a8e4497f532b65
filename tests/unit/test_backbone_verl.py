"""verl backbone: overrides with verl 0.9.1's real key names, refusals, the sample ->
DataProto / AgentLoopOutput conversion on hand-built samples, the dataset rows, the engine
conversions, and the CLI dry-run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.backbones.gpu_config import flatten
from ajet.backbones.registry import backbone_problems
from ajet.backbones.verl.convert import (
    SampleTooLongError,
    pick_episode_sample,
    sample_to_agent_loop_fields,
    task_from_extra_info,
    task_to_verl_row,
    write_parquet,
)
from ajet.backbones.verl.engine import token_output_to_completion, verl_sampling_params
from ajet.backbones.verl.translation import (
    AGENT_LOOP_TARGET,
    AGENT_NAME,
    agent_loop_registry,
    hydra_overrides,
    to_verl_config,
)
from ajet.cli import train as train_cmd
from ajet.config.schema import AjetConfig, LossAgg
from ajet.context.types import Sample
from ajet.engine.base import SamplingParams
from ajet.errors import InfrastructureError
from ajet.workflow import WorkflowTask

# Child keys of verl 0.9.1's `ppo_trainer` config under every section the translation
# writes, extracted from `verl/trainer/config/_generated_ppo_trainer.yaml` in the wheel
# (`pip download --no-deps verl==0.9.1`). Hydra refuses an override of a key not in this tree.
VERL_091_KEYS = {
    '': (
        'actor_rollout_ref data critic custom_reward_function reward_model sandbox_fusion reward algorithm distillation transfer_queue trainer global_profiler skip ray_kwargs'
    ),
    'actor_rollout_ref': (
        'actor ref rollout model hybrid_engine nccl_timeout'
    ),
    'actor_rollout_ref.actor': (
        'optim fsdp_config rollout_n strategy ppo_mini_batch_size ppo_micro_batch_size ppo_micro_batch_size_per_gpu use_dynamic_bsz ppo_max_token_len_per_gpu clip_ratio clip_ratio_low clip_ratio_high tau_pos tau_neg freeze_vision_tower policy_loss clip_ratio_c loss_agg_mode loss_scale_factor entropy_coeff calculate_entropy calculate_sum_pi_squared use_kl_loss use_prefix_grouper use_torch_compile kl_loss_coef kl_loss_type ppo_epochs shuffle data_loader_seed checkpoint use_fused_kernels profiler qat grad_clip ulysses_sequence_parallel_size entropy_from_logits_with_chunking entropy_from_logits_chunk_size entropy_checkpointing pad_to_length use_remove_padding'
    ),
    'actor_rollout_ref.actor.optim': (
        'optimizer optimizer_impl lr lr_warmup_steps_ratio total_training_steps weight_decay lr_warmup_steps betas clip_grad min_lr_ratio num_cycles lr_scheduler_type zero_indexed_step warmup_style override_optimizer_config'
    ),
    'actor_rollout_ref.model': (
        'path hf_config_path tokenizer_path use_shm trust_remote_code custom_chat_template external_lib override_config enable_gradient_checkpointing enable_activation_offload use_remove_padding lora_rank lora_alpha target_modules exclude_modules lora_adapter_path use_liger use_fused_kernels fused_kernel_options tiled_mlp mtp lora'
    ),
    'actor_rollout_ref.rollout': (
        'name mode nnodes n_gpus_per_node temperature top_k top_p full_determinism seed prompt_length response_length dtype gpu_memory_utilization ignore_eos enforce_eager cudagraph_capture_sizes free_cache_engine tensor_model_parallel_size data_parallel_size expert_parallel_size pipeline_model_parallel_size max_num_batched_tokens max_model_len max_num_seqs enable_chunked_prefill enable_prefix_caching logprobs_mode scheduling_policy load_format layered_summon log_prob_micro_batch_size log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz log_prob_max_token_len_per_gpu disable_log_stats do_sample n over_sample_rate multi_stage_wake_up engine_kwargs val_kwargs router_config_path multi_turn calculate_log_probs agent checkpoint_engine trace skip_tokenizer_init enable_rollout_routing_replay moe_load_balance_metrics_interval profiler prometheus quantization quantization_config_file mtp qat disaggregation'
    ),
    'actor_rollout_ref.rollout.agent': (
        'num_workers default_agent_loop agent_loop_config_path custom_async_server'
    ),
    'actor_rollout_ref.rollout.val_kwargs': (
        'top_k top_p temperature n do_sample'
    ),
    'algorithm': (
        'rollout_correction gamma lam adv_estimator norm_adv_by_std_in_grpo filter_groups use_kl_in_reward kl_penalty kl_ctrl use_pf_ppo pf_ppo'
    ),
    'data': (
        'tokenizer use_shm train_files val_files train_max_samples val_max_samples prompt_key reward_fn_key max_prompt_length max_response_length train_batch_size gen_batch_size val_batch_size tool_config_path function_tool_path return_raw_input_ids return_raw_chat return_full_prompt shuffle seed dataloader_num_workers image_patch_size validation_shuffle filter_overlong_prompts filter_overlong_prompts_workers truncation image_key video_key audio_key trust_remote_code custom_cls return_multi_modal_inputs apply_chat_template_kwargs mm_processor_kwargs'
    ),
    'trainer': (
        'balance_batch total_epochs total_training_steps project_name experiment_name logger log_val_generations rollout_data_dir validation_data_dir nnodes n_gpus_per_node save_freq esi_redundant_time resume_mode resume_from_path checkpoint_callback_class val_before_train val_only test_freq critic_warmup default_hdfs_dir del_local_ckpt_after_load default_local_dir max_actor_ckpt_to_keep max_critic_ckpt_to_keep ray_wait_register_center_timeout device use_v1 v1'
    ),
}


def unknown_keys(tree: dict, prefix: str = "") -> list[str]:
    bad = []
    allowed = set(VERL_091_KEYS[prefix].split())
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in allowed:
            bad.append(path)
        elif isinstance(value, dict) and value:
            bad += unknown_keys(value, path)
    return bad


def make_cfg(tmp_path: Path) -> AjetConfig:
    cfg = AjetConfig()
    cfg.project.name, cfg.project.exp_dir = "run1", str(tmp_path / "exp")
    cfg.rollout.n, cfg.rollout.top_k, cfg.rollout.temperature = 6, 20, 0.8
    cfg.trainer.lr, cfg.trainer.batch_size, cfg.trainer.total_steps = 3e-6, 5, 7
    cfg.trainer.save_every, cfg.trainer.val_every, cfg.trainer.keep_checkpoints = 3, 2, 0
    cfg.context.max_sample_tokens = 1500
    cfg.algorithm.kl_coef, cfg.algorithm.entropy_coef = 0.02, 0.001
    cfg.verl.n_gpus_per_node, cfg.verl.nnodes, cfg.verl.tensor_model_parallel_size = 8, 2, 2
    return cfg


def test_translation_uses_verl_keys_and_values(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    cfg.model.lora.enabled = True
    out = to_verl_config(cfg, model_path="/ckpt/model", resume=True)
    assert unknown_keys(out) == []
    flat = flatten(out)
    run = (tmp_path / "exp" / "run1").resolve()
    assert flat["actor_rollout_ref.model.path"] == "/ckpt/model"
    assert flat["algorithm.adv_estimator"] == "grpo" and flat["algorithm.norm_adv_by_std_in_grpo"] is True
    assert flat["actor_rollout_ref.rollout.n"] == 6
    assert flat["actor_rollout_ref.rollout.top_k"] == 20 and flat["actor_rollout_ref.rollout.temperature"] == 0.8
    assert flat["actor_rollout_ref.actor.optim.lr"] == 3e-6
    assert flat["data.train_batch_size"] == 5 == flat["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert flat["trainer.total_training_steps"] == 7 and flat["trainer.save_freq"] == 3
    assert flat["trainer.test_freq"] == 2 and flat["trainer.val_before_train"] is True
    assert flat["trainer.max_actor_ckpt_to_keep"] is None  # keep_checkpoints=0: keep all
    assert flat["data.max_prompt_length"] == 1500 == flat["data.max_response_length"]
    assert flat["actor_rollout_ref.actor.use_kl_loss"] is True and flat["actor_rollout_ref.actor.kl_loss_coef"] == 0.02
    assert flat["actor_rollout_ref.actor.entropy_coeff"] == 0.001
    assert flat["trainer.n_gpus_per_node"] == 8 and flat["trainer.nnodes"] == 2
    assert flat["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2
    assert flat["actor_rollout_ref.model.lora_rank"] == 8
    assert flat["actor_rollout_ref.model.target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert flat["trainer.default_local_dir"] == str(run / "verl" / "checkpoints")
    assert flat["trainer.resume_mode"] == "auto"
    assert flat["trainer.use_v1"] is True  # its agent loops may return no output (a failed episode)
    assert flat["actor_rollout_ref.rollout.agent.default_agent_loop"] == AGENT_NAME
    assert flat["actor_rollout_ref.rollout.agent.agent_loop_config_path"] == str(run / "verl" / "agent_loops.yaml")
    assert agent_loop_registry() == [{"name": AGENT_NAME, "_target_": AGENT_LOOP_TARGET}]


def test_translation_variants(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    for name, expected in (("rloo", "rloo"), ("reinforce_pp", "reinforce_plus_plus")):
        cfg.algorithm.name = name
        assert to_verl_config(cfg, model_path="/m")["algorithm"]["adv_estimator"] == expected
    cfg.algorithm.kl_coef = 0.0
    cfg.context.loss_agg = LossAgg.episode_mean
    cfg.trainer.val_every = 0
    out = flatten(to_verl_config(cfg, model_path="/m"))
    assert out["actor_rollout_ref.actor.use_kl_loss"] is False
    assert out["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert out["trainer.test_freq"] == -1 and out["trainer.val_before_train"] is False
    assert out["trainer.resume_mode"] == "disable"


def test_hydra_overrides_are_key_value_and_quote_what_hydra_would_parse(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    overrides = hydra_overrides(to_verl_config(cfg, model_path="/models/my model,v2"))
    assert all("=" in o and not o.startswith("+") for o in overrides)
    by_key = dict(o.split("=", 1) for o in overrides)
    assert by_key["actor_rollout_ref.model.path"] == '"/models/my model,v2"'
    assert by_key["actor_rollout_ref.rollout.n"] == "6"
    assert by_key["trainer.max_actor_ckpt_to_keep"] == "null"
    assert by_key["trainer.logger"] == "[console,tensorboard]"
    assert by_key["actor_rollout_ref.actor.use_kl_loss"] == "true"


def test_overrides_compose_with_real_verl_config_when_installed(tmp_path: Path) -> None:
    """Runs in the verl environment (make env-verl): Hydra composes verl's own ppo_trainer."""
    pytest.importorskip("verl", reason="runs in .venv-verl: make test-verl (part of make test)")
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    out = to_verl_config(make_cfg(tmp_path), model_path="/m")
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        composed = compose(config_name="ppo_trainer", overrides=hydra_overrides(out))
    assert all(OmegaConf.select(composed, k) == v for k, v in flatten(out).items())


def keys(problems: list[tuple[str, str]]) -> set[str]:
    return {k for k, _ in problems}


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    """What --backbone=verl refuses: its capabilities, then its own checks."""
    return backbone_problems("verl", cfg)


def test_check_config_refuses_settings_verl_would_ignore() -> None:
    assert check_config(AjetConfig()) == []
    cfg = AjetConfig()
    cfg.trinity.explorer_gpus = 4
    cfg.trinity.sync_method = "checkpoint"
    cfg.model.device = "cpu"
    cfg.context.merge = False
    cfg.context.loss_agg = LossAgg.seq_mean
    cfg.rollout.drop_equal_reward_groups = True
    cfg.trainer.lr_schedule = "linear"
    problems = check_config(cfg)
    assert keys(problems) == {"trinity.explorer_gpus", "trinity.sync_method", "model.device", "context.merge",
                              "context.loss_agg", "rollout.drop_equal_reward_groups", "trainer.lr_schedule"}
    assert "--backbone=verl" in dict(problems)["trinity.explorer_gpus"]
    cfg = AjetConfig()
    cfg.model.lora.enabled, cfg.model.lora.dropout = True, 0.1
    assert keys(check_config(cfg)) == {"model.lora.dropout"}


def sample(input_ids: list[int], loss_mask: list[int], reward: float = 1.0, group: str = "t1") -> Sample:
    logprobs = [-0.5 * (i + 1) if m else 0.0 for i, m in enumerate(loss_mask)]
    return Sample(input_ids=input_ids, loss_mask=loss_mask, old_logprobs=logprobs, group_id=group,
                  episode_id=f"{group}-e0", reward=reward, num_calls=2)


def test_agent_loop_fields_split_at_first_trained_token() -> None:
    # prompt (3) | call 1 (2 trained) | tool output (2) | call 2 (1 trained)
    s = sample([10, 11, 12, 20, 21, 30, 31, 40], [0, 0, 0, 1, 1, 0, 0, 1], reward=0.5)
    f = sample_to_agent_loop_fields(s, max_prompt_length=4, max_response_length=5)
    assert f["prompt_ids"] == [10, 11, 12]
    assert f["response_ids"] == [20, 21, 30, 31, 40]
    assert f["response_mask"] == [1, 1, 0, 0, 1]
    assert f["response_logprobs"] == [-2.0, -2.5, 0.0, 0.0, -4.0]
    assert f["reward_score"] == 0.5 and f["num_turns"] == 4
    with pytest.raises(SampleTooLongError, match="max_response_length=4"):
        sample_to_agent_loop_fields(s, max_prompt_length=4, max_response_length=4)
    with pytest.raises(ValueError, match="no trained token"):
        sample_to_agent_loop_fields(sample([1, 2], [0, 0]), max_prompt_length=4, max_response_length=4)


def test_pick_episode_sample_counts_what_is_left_out() -> None:
    small = sample([1, 2, 3], [0, 1, 0])
    big = sample([1, 2, 3, 4], [0, 1, 1, 1])
    untrained = sample([1, 9], [0, 0])
    assert pick_episode_sample([small, big, untrained]) == (big, 1)
    assert pick_episode_sample([untrained]) == (None, 0)


def test_dataset_rows_round_trip(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    task = WorkflowTask(task_id="t3", main_query="2+2?", metadata={"answer": 4})
    row = task_to_verl_row(task, index=0, split="train", config_path="/run/config.yaml")
    assert row["prompt"] == [{"role": "user", "content": "2+2?"}] and row["agent_name"] == AGENT_NAME
    path = write_parquet(tmp_path / "train.parquet", [row, task_to_verl_row(task, index=1, split="train",
                                                                            config_path="/run/config.yaml")])
    back = pq.read_table(path).to_pylist()
    assert [task_from_extra_info(r["extra_info"]) for r in back] == [(task, "/run/config.yaml")] * 2
    with pytest.raises(ValueError, match="ajet_task"):
        task_from_extra_info({"index": 0})


def test_engine_conversions() -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_tokens=3, stop=["</s>"])
    assert verl_sampling_params(params) == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 3,
                                            "logprobs": True, "stop": ["</s>"]}
    eos = {2}
    full = token_output_to_completion([5, 6, 7], [-0.1, -0.2, -0.3], "completed", max_tokens=3,
                                      eos_token_ids=eos, policy_version=1)
    assert full.finish_reason == "length" and full.token_ids == [5, 6, 7] and full.logprobs == [-0.1, -0.2, -0.3]
    stopped = token_output_to_completion([5, 2], [-0.1, -0.2], "completed", max_tokens=3, eos_token_ids=eos,
                                         policy_version=1)
    assert stopped.finish_reason == "stop"
    assert token_output_to_completion([5, 6, 2], [0.0] * 3, None, max_tokens=3, eos_token_ids=eos,
                                      policy_version=0).finish_reason == "stop"
    with pytest.raises(InfrastructureError, match="aborted"):
        token_output_to_completion([], None, "aborted", max_tokens=3, eos_token_ids=eos, policy_version=0)
    with pytest.raises(InfrastructureError, match="calculate_log_probs"):
        token_output_to_completion([5], None, "completed", max_tokens=3, eos_token_ids=eos, policy_version=0)


def test_cli_dry_run_prints_translated_verl_overrides(tmp_path: Path, stub_run_conf: Callable[..., Path]) -> None:
    import yaml

    conf = stub_run_conf()
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--backbone=verl", "--dry-run",
                                                "algorithm.name=rloo"])
    assert result.exit_code == 0, result.output
    translated = yaml.safe_load(result.output.split("# translated verl config")[1])
    assert unknown_keys(translated) == []
    assert translated["algorithm"]["adv_estimator"] == "rloo"
    assert translated["actor_rollout_ref"]["model"]["path"] == str(tmp_path / "model")


def test_cli_dry_run_refuses_untranslated_settings(tmp_path: Path, stub_run_conf: Callable[..., Path]) -> None:
    conf = stub_run_conf("context: {merge: false}\ntrinity: {sync_interval: 4}\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--backbone=verl", "--dry-run"])
    assert result.exit_code == 2
    assert "context.merge" in result.output and "trinity.sync_interval" in result.output
    assert "Traceback" not in result.output


def test_cli_without_gpu_says_to_use_debug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stub_run_conf: Callable[..., Path]) -> None:
    import ajet.gpus

    monkeypatch.setattr(ajet.gpus, "query_gpus", lambda: [])
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(stub_run_conf()), "--backbone=verl"])
    assert result.exit_code == 1
    assert "needs NVIDIA GPUs" in result.output and "--backbone=debug" in result.output
    assert isinstance(result.exception, SystemExit)


def test_prepare_writes_what_verl_reads(tmp_path: Path, stub_run_conf: Callable[..., Path]) -> None:
    import json

    import pyarrow.parquet as pq
    import yaml

    from ajet.backbones.verl.driver import prepare
    from ajet.config import load_config
    from ajet.errors import UserError

    conf = stub_run_conf()
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"q{i}"}) + "\n"
                                                  for i in range(3)))
    cfg = load_config(conf, [f"project.exp_dir={tmp_path / 'exp'}"])
    overrides = dict(o.split("=", 1) for o in prepare(cfg, resume=False))
    out = (tmp_path / "exp" / "ajet" / "verl").resolve()
    assert overrides["data.train_files"] == str(out / "train.parquet")
    rows = pq.read_table(out / "train.parquet").to_pylist()
    tasks = [task_from_extra_info(r["extra_info"]) for r in rows]
    assert [t.task_id for t, _ in tasks] == ["t0", "t1", "t2"]
    assert all(Path(p).is_file() for _, p in tasks)  # the agent loop finds the run's config
    assert pq.read_table(out / "val.parquet").num_rows == 3  # no val set: train tasks stand in
    assert yaml.safe_load((out / "agent_loops.yaml").read_text()) == agent_loop_registry()
    assert unknown_keys(yaml.safe_load((out / "overrides.yaml").read_text())) == []
    (out / "checkpoints" / "global_step_1").mkdir(parents=True)
    with pytest.raises(UserError, match="--resume"):
        prepare(cfg, resume=False)
    assert dict(o.split("=", 1) for o in prepare(cfg, resume=True))["trainer.resume_mode"] == "auto"
