"""Trinity backbone: config translation (real trinity-rft 0.6.0 key names), refusals, the
sample -> Experience conversion on hand-built samples, the task round trip, the engine's
request/response handling, and the CLI dry-run / no-GPU paths."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.backbones.gpu_config import flatten
from ajet.backbones.registry import backbone_problems
from ajet.backbones.trinity.convert import (
    episode_experience_fields,
    sample_to_experience_fields,
    task_from_row,
    task_to_row,
    write_taskset,
)
from ajet.backbones.trinity.engine import completion_request, parse_choice
from ajet.backbones.trinity.translation import WORKFLOW_TYPE, to_trinity_config
from ajet.cli import train as train_cmd
from ajet.config.schema import AjetConfig, LossAgg, ReaderType
from ajet.context.types import Sample
from ajet.engine.base import SamplingParams
from ajet.errors import InfrastructureError
from ajet.workflow import WorkflowTask

# Field names of trinity-rft 0.6.0's `trinity.common.config` dataclasses under every section
# the translation writes, extracted from the wheel (`pip download --no-deps trinity-rft==0.6.0`,
# OmegaConf.structured(Config)). "X[]" is the element schema of the list X. Sections ending in
# `_args` are free-form keyword arguments and are not listed.
TRINITY_060_KEYS = {
    '': (
        'mode project group name checkpoint_root_dir checkpoint_job_dir ray_namespace continue_from_checkpoint ignore_validator_suggestions algorithm data_processor model cluster buffer explorer trainer monitor synchronizer service log stages'
    ),
    'algorithm': (
        'algorithm_type repeat_times optimizer sample_strategy sample_strategy_args advantage_fn advantage_fn_args kl_penalty_fn kl_penalty_fn_args policy_loss_fn policy_loss_fn_args kl_loss_fn kl_loss_fn_args entropy_loss_fn entropy_loss_fn_args loss_agg_mode enable_router_replay bypass_old_logprobs rollout_correction'
    ),
    'algorithm.optimizer': (
        'lr lr_warmup_steps lr_warmup_steps_ratio min_lr_ratio warmup_style lr_scheduler_type optimizer_type betas weight_decay clip_grad'
    ),
    'buffer': (
        'batch_size train_batch_size total_epochs total_steps explorer_input trainer_input explorer_output tokenizer_path cache_dir'
    ),
    'buffer.explorer_input': (
        'taskset tasksets eval_tasksets default_workflow_type default_eval_workflow_type default_reward_fn_type'
    ),
    'buffer.explorer_input.taskset': (
        'name storage_type path default_workflow_type default_reward_fn_type rollout_args workflow_args reward_fn_args task_selector data_selector split subset_name format max_retry_times max_retry_interval enable_progress_bar repeat_times index is_eval batch_size total_epochs total_steps ray_namespace'
    ),
    'buffer.explorer_input.taskset.rollout_args': (
        'temperature top_p top_k logprobs max_tokens n'
    ),
    'buffer.trainer_input': (
        'experience_buffer auxiliary_buffers'
    ),
    'buffer.trainer_input.experience_buffer': (
        'name storage_type path capacity max_read_timeout replay_buffer max_retry_times max_retry_interval split subset_name format enable_progress_bar data_selector schema_type index batch_size tokenizer_path total_epochs total_steps ray_namespace'
    ),
    'cluster': (
        'ray_address node_num gpu_per_node total_gpu_num rollout_gpu_num auxiliary_model_gpu_num explorer_gpu_num trainer_gpu_num trainer_node_num trainer_gpu_num_per_node'
    ),
    'explorer': (
        'name runner_per_model runner_prepare_concurrency runner_prepare_max_retries max_timeout max_retry_times env_vars concurrent_mode max_repeat_times_per_runner runner_num rollout_model auxiliary_models eval_interval eval_on_startup bench_on_latest_checkpoint proxy_port listen_address service_status_check_interval min_running_model_num db_url over_rollout dynamic_timeout runner_state_report_interval max_inflight_batches'
    ),
    'explorer.rollout_model': (
        'model_path name trust_remote_code engine_type engine_num tensor_parallel_size data_parallel_size pipeline_parallel_size enable_expert_parallel gpu_per_engine extra_engine_args use_v1 enforce_eager enable_prefix_caching enable_chunked_prefill gpu_memory_utilization dtype seed temperature top_p top_k logprobs max_model_len max_prompt_tokens max_response_tokens min_response_tokens enable_prompt_truncation repetition_penalty ignore_eos enable_multimodal chat_template enable_thinking enable_history enable_openai_api enable_log_requests base_port api_key enable_auto_tool_choice tool_call_parser reasoning_parser external_model_config nnodes node_rank enable_return_routed_experts weight_sync_buffer_size bundle_indices engine_id ray_namespace ray_actor_name sync_method checkpoint_job_dir cuda_visible_devices enable_lora enable_runtime_lora_updating lora_modules lora_kwargs rope_scaling rope_theta'
    ),
    'log': (
        'level group_by_node save_dir'
    ),
    'model': (
        'model_path trust_remote_code critic_model_path custom_chat_template chat_template_path temperature top_p top_k logprobs max_model_len max_prompt_tokens max_response_tokens min_response_tokens enable_prompt_truncation repetition_penalty enable_thinking lora_configs fully_sharded_loras max_cpu_loras rope_scaling rope_theta tinker external_model'
    ),
    'monitor': (
        'monitor_type monitor_args detailed_stats enable_ray_timeline cache_dir'
    ),
    'synchronizer': (
        'sync_method sync_style sync_interval explorer_sync_interval trainer_sync_interval sync_offset sync_timeout group_name wait_for_checkpoint explorer_world_size ray_namespace'
    ),
    'trainer': (
        'name trainer_type trainer_strategy save_interval enable_preview total_steps save_hf_checkpoint grad_clip use_dynamic_bsz use_remove_padding balance_batch critic_warmup max_token_len_per_gpu ulysses_sequence_parallel_size fix_actor_microbatch_loss_scale param_offload optimizer_offload grad_offload offload_policy save_strategy max_checkpoints_to_keep megatron trainer_config trainer_config_path'
    ),
    'model.lora_configs[]': (
        'name path base_model_name lora_rank lora_alpha lora_dtype target_modules exclude_modules is_dummy'
    ),
    'buffer.explorer_input.eval_tasksets[]': (
        'name storage_type path default_workflow_type default_reward_fn_type rollout_args workflow_args reward_fn_args task_selector data_selector split subset_name format max_retry_times max_retry_interval enable_progress_bar repeat_times index is_eval batch_size total_epochs total_steps ray_namespace'
    ),
}


def unknown_keys(tree: dict, prefix: str = "") -> list[str]:
    """Keys of `tree` that trinity-rft 0.6.0 does not have (free-form `*_args` dicts skipped)."""
    bad = []
    allowed = set(TRINITY_060_KEYS[prefix].split())
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in allowed:
            bad.append(path)
        elif isinstance(value, dict) and not key.endswith("_args"):
            bad += unknown_keys(value, path)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                bad += [f"{path}[]." + k for k in item if k not in set(TRINITY_060_KEYS[f"{path}[]"].split())]
    return bad


def make_cfg(tmp_path: Path) -> AjetConfig:
    cfg = AjetConfig()
    cfg.project.name, cfg.project.exp_dir = "run1", str(tmp_path / "exp")
    cfg.rollout.n, cfg.rollout.max_tokens, cfg.rollout.top_k = 6, 123, 0
    cfg.trainer.lr, cfg.trainer.batch_size, cfg.trainer.total_steps = 3e-6, 5, 7
    cfg.trainer.micro_batch_tokens, cfg.trainer.save_every, cfg.trainer.keep_checkpoints = 2048, 3, 4
    cfg.algorithm.kl_coef, cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high = 0.02, 0.1, 0.3
    cfg.trinity.explorer_gpus, cfg.trinity.trainer_gpus = 2, 3
    return cfg


def test_translation_uses_trinity_keys_and_values(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    cfg.trainer.val_every = 2
    cfg.model.lora.enabled = True
    out = to_trinity_config(cfg, model_path="/ckpt/model", resume=True)
    assert unknown_keys(out) == []
    flat = flatten(out)
    run = (tmp_path / "exp" / "run1").resolve()
    assert flat["model.model_path"] == "/ckpt/model"
    assert flat["algorithm.algorithm_type"] == "multi_step_grpo"
    assert flat["algorithm.repeat_times"] == 6
    assert flat["algorithm.optimizer.lr"] == 3e-6
    assert flat["buffer.batch_size"] == 5 and flat["buffer.total_steps"] == 7 == flat["trainer.total_steps"]
    assert flat["model.max_response_tokens"] == 123 and flat["model.top_k"] == -1
    assert flat["algorithm.kl_loss_fn"] == "k3" and flat["algorithm.kl_loss_fn_args.kl_coef"] == 0.02
    assert flat["algorithm.policy_loss_fn_args.clip_range_low"] == 0.1
    assert flat["algorithm.policy_loss_fn_args.clip_range_high"] == 0.3
    assert flat["trainer.max_token_len_per_gpu"] == 2048 and flat["trainer.save_interval"] == 3
    assert flat["trainer.max_checkpoints_to_keep"] == 4
    assert flat["cluster.gpu_per_node"] == 5 and flat["explorer.rollout_model.engine_num"] == 2
    assert flat["mode"] == "both" and flat["continue_from_checkpoint"] is True
    # Trinity's checkpoint_job_dir = checkpoint_root_dir/project/group/name = the run dir / trinity
    assert Path(flat["checkpoint_root_dir"]) / flat["project"] / flat["group"] / flat["name"] == run / "trinity"
    taskset = out["buffer"]["explorer_input"]["taskset"]
    assert taskset["default_workflow_type"] == WORKFLOW_TYPE and taskset["path"] == str(run / "tasks")
    assert taskset["workflow_args"] == {"ajet_config": str(run / "config.yaml")}
    assert out["buffer"]["explorer_input"]["eval_tasksets"][0]["split"] == "validation"
    lora = out["model"]["lora_configs"][0]
    assert lora["lora_rank"] == 8 and lora["lora_alpha"] == 16
    assert lora["target_modules"] == r".*\.(k_proj|o_proj|q_proj|v_proj)"
    assert flat["explorer.rollout_model.enable_openai_api"] is True  # our engine needs the endpoint


def test_translation_variants(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    cfg.algorithm.kl_coef = 0.0
    cfg.trinity.explorer_gpus, cfg.trinity.trainer_gpus = 1, 0
    cfg.rollout.drop_equal_reward_groups = True
    out = to_trinity_config(cfg, model_path="/m")
    assert out["mode"] == "colocate" and out["synchronizer"]["sync_method"] == "memory"
    assert out["algorithm"]["kl_loss_fn"] == "none"
    assert out["algorithm"]["advantage_fn_args"] == {"std_threshold": 0.0}
    assert "eval_tasksets" not in out["buffer"]["explorer_input"]  # val_every=0
    assert out["continue_from_checkpoint"] is False
    for name, expected in (("rloo", "rloo"), ("reinforce_pp", "reinforceplusplus")):
        cfg.algorithm.name = name
        assert to_trinity_config(cfg, model_path="/m")["algorithm"]["algorithm_type"] == expected
    cfg.context.loss_agg = LossAgg.seq_mean
    assert to_trinity_config(cfg, model_path="/m")["algorithm"]["loss_agg_mode"] == "seq-mean-token-mean"


def test_translation_passes_real_trinity_schema_when_installed(tmp_path: Path) -> None:
    """Runs in the trinity environment (make env-trinity): the real schema and validators."""
    pytest.importorskip("trinity", reason="runs in .venv-trinity: make test-trinity (part of make test)")
    from omegaconf import OmegaConf
    from trinity.common.config import Config

    cfg = make_cfg(tmp_path)
    merged = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), to_trinity_config(cfg, model_path="/m")))
    assert merged.algorithm.repeat_times == 6


def keys(problems: list[tuple[str, str]]) -> set[str]:
    return {k for k, _ in problems}


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    """What --backbone=trinity refuses: its capabilities, then its own checks."""
    return backbone_problems("trinity", cfg)


def test_check_config_refuses_settings_trinity_would_ignore() -> None:
    assert check_config(AjetConfig()) == []
    cfg = AjetConfig()
    cfg.verl.n_gpus_per_node = 4
    cfg.model.device = "cpu"
    cfg.algorithm.norm_adv_by_std = False
    cfg.trainer.ppo_epochs = 2
    cfg.context.loss_agg = LossAgg.episode_mean
    cfg.task_reader.type = ReaderType.generate
    problems = check_config(cfg)
    assert keys(problems) == {"verl.n_gpus_per_node", "model.device", "algorithm.norm_adv_by_std",
                              "trainer.ppo_epochs", "context.loss_agg", "task_reader.type"}
    message = dict(problems)["verl.n_gpus_per_node"]
    assert "--backbone=trinity" in message and "verl" in message
    assert "--backbone=debug" in dict(problems)["model.device"]
    for name in ("sft", "ppo"):
        cfg = AjetConfig()
        cfg.algorithm.name = name
        assert keys(check_config(cfg)) == {"algorithm.name"}
    cfg = AjetConfig()
    cfg.trinity.trainer_gpus, cfg.trinity.explorer_gpus = 0, 2
    assert keys(check_config(cfg)) == {"trinity.trainer_gpus"}


def sample(input_ids: list[int], loss_mask: list[int], **kw: object) -> Sample:
    logprobs = [-0.5 * (i + 1) if m else 0.0 for i, m in enumerate(loss_mask)]
    return Sample(input_ids=input_ids, loss_mask=loss_mask, old_logprobs=logprobs,
                  group_id="t1", episode_id="t1-e0", reward=0.75, **kw)


def test_experience_fields_have_prompt_length_and_response_masks() -> None:
    # prompt (3) | call 1 (2 trained) | tool output (2, untrained) | call 2 (1 trained)
    s = sample([10, 11, 12, 20, 21, 30, 31, 40], [0, 0, 0, 1, 1, 0, 0, 1])
    f = sample_to_experience_fields(s, step=2)
    assert f["tokens"] == [10, 11, 12, 20, 21, 30, 31, 40]
    assert f["prompt_length"] == 3
    assert f["action_mask"] == [True, True, False, False, True]
    assert f["logprobs"] == [-2.0, -2.5, 0.0, 0.0, -4.0]
    assert len(f["logprobs"]) == len(f["action_mask"]) == len(f["tokens"]) - f["prompt_length"]
    assert f["reward"] == 0.75 and f["eid"] == {"step": 2}
    assert f["info"]["episode_id"] == "t1-e0" and f["info"]["group_id"] == "t1"


def test_episode_fields_skip_untrained_samples_and_number_steps() -> None:
    trained = sample([1, 2, 3], [0, 1, 1])
    untrained = sample([1, 2, 9], [0, 0, 0])
    fields = episode_experience_fields([untrained, trained, trained], {"ajet/reward": 0.75})
    assert [f["eid"]["step"] for f in fields] == [0, 1]
    assert all(f["metrics"] == {"ajet/reward": 0.75} for f in fields)
    with pytest.raises(ValueError, match="differ in length"):
        sample_to_experience_fields(Sample(input_ids=[1, 2], loss_mask=[0, 1], old_logprobs=[0.0]))


def test_taskset_round_trip(tmp_path: Path) -> None:
    task = WorkflowTask(task_id="t7", main_query="2+3?", metadata={"answer": 5, "nested": {"a": [1, 2]}},
                        init_messages=[{"role": "system", "content": "be brief"}])
    assert task_from_row(json.loads(json.dumps(task_to_row(task)))) == task
    out = write_taskset(tmp_path / "tasks", [task], [])
    lines = (out / "train.jsonl").read_text().splitlines()
    assert [task_from_row(json.loads(line)) for line in lines] == [task]
    assert not (out / "validation.jsonl").exists()
    with pytest.raises(ValueError, match="ajet_task"):
        task_from_row({"question": "x"})


def test_completions_engine_request_and_parse() -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_tokens=5, stop=["\n"], seed=3)
    body = completion_request([1, 2, 3], params, model="/m")
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 5 and body["top_k"] == -1
    assert body["logprobs"] == 1 and body["return_token_ids"] and body["stop"] == ["\n"] and body["seed"] == 3
    new = parse_choice({"text": "hi", "token_ids": [7, 8], "finish_reason": "length",
                        "logprobs": {"token_logprobs": [-0.1, -0.2], "tokens": ["a", "b"]}}, policy_version=4)
    assert (new.token_ids, new.logprobs, new.finish_reason, new.policy_version) == ([7, 8], [-0.1, -0.2], "length", 4)
    old = parse_choice({"finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0, -2.0],
                                                              "tokens": ["token_id:5", "token_id:2"]}}, policy_version=0)
    assert old.token_ids == [5, 2] and old.finish_reason == "stop"
    with pytest.raises(InfrastructureError, match="token_id"):
        parse_choice({"logprobs": {"token_logprobs": [-1.0], "tokens": ["hello"]}}, policy_version=0)
    with pytest.raises(InfrastructureError, match="logprobs"):
        parse_choice({"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}, policy_version=0)


# ---------------------------------------------------------------------- CLI
def test_cli_dry_run_prints_translated_trinity_config(tmp_path: Path, stub_run_conf: Callable[..., Path]) -> None:
    import yaml

    conf = stub_run_conf()
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--backbone=trinity", "--dry-run",
                                                "rollout.n=3"])
    assert result.exit_code == 0, result.output
    translated = yaml.safe_load(result.output.split("# translated trinity config")[1])
    assert unknown_keys(translated) == []
    assert translated["algorithm"]["repeat_times"] == 3
    assert translated["model"]["model_path"] == str(tmp_path / "model")


def test_cli_dry_run_refuses_verl_settings(tmp_path: Path, stub_run_conf: Callable[..., Path]) -> None:
    conf = stub_run_conf("verl: {nnodes: 2}\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--backbone=trinity", "--dry-run"])
    assert result.exit_code == 2
    assert "verl.nnodes" in result.output and "--backbone=trinity" in result.output
    assert "Traceback" not in result.output


def test_cli_without_gpu_says_to_use_debug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stub_run_conf: Callable[..., Path]) -> None:
    import ajet.gpus

    monkeypatch.setattr(ajet.gpus, "query_gpus", lambda: [])
    conf = stub_run_conf()
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--backbone=trinity"])
    assert result.exit_code == 1
    assert "needs NVIDIA GPUs" in result.output and "--backbone=debug" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_prepare_writes_what_trinity_reads(tmp_path: Path, stub_run_conf: Callable[..., Path]) -> None:
    import yaml

    from ajet.backbones.trinity.driver import prepare
    from ajet.config import load_config
    from ajet.errors import UserError

    conf = stub_run_conf("trainer: {val_every: 1}\n")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"q{i}"}) + "\n"
                                                  for i in range(4)))
    cfg = load_config(conf, [f"project.exp_dir={tmp_path / 'exp'}", "task_reader.val_fraction=0.5"])
    path = prepare(cfg, resume=False)
    run = (tmp_path / "exp" / "ajet").resolve()
    assert path == run / "trinity_config.yaml"
    written = yaml.safe_load(path.read_text())
    assert unknown_keys(written) == []
    taskset = written["buffer"]["explorer_input"]["taskset"]
    assert Path(taskset["workflow_args"]["ajet_config"]).is_file()
    train = [task_from_row(json.loads(line)) for line in (Path(taskset["path"]) / "train.jsonl").read_text().splitlines()]
    val = [task_from_row(json.loads(line)) for line in (run / "tasks" / "validation.jsonl").read_text().splitlines()]
    assert sorted(t.task_id for t in train + val) == ["t0", "t1", "t2", "t3"] and len(val) == 2
    (run / "trinity" / "global_step_2").mkdir(parents=True)
    with pytest.raises(UserError, match="--resume"):
        prepare(cfg, resume=False)
    assert yaml.safe_load(prepare(cfg, resume=True).read_text())["continue_from_checkpoint"] is True


@pytest.mark.integration
def test_episode_runtime_turns_an_episode_into_experiences(two_calls_conf: Path) -> None:
    """What the Trinity plugin runs in a runner process, with ajet's LocalEngine (tiny model)
    standing in for Trinity's vLLM endpoint."""
    import asyncio

    from ajet.backbones.gpu_worker import EpisodeRuntime
    from ajet.config import load_config
    from ajet.engine.local import LocalEngine
    from ajet.models.load import load_model_and_tokenizer

    cfg = load_config(two_calls_conf)
    model, tokenizer = load_model_and_tokenizer(cfg.model)
    engine = LocalEngine(model, tokenizer, max_batch_size=2, max_model_len=2048)
    runtime = EpisodeRuntime(cfg, engine, tokenizer)
    try:
        task = WorkflowTask(task_id="t1", main_query="Count to three.")
        episode, samples, metrics = asyncio.run(runtime.run(task, "t1-e0", group_id="t1"))
    finally:
        runtime.close()
        engine.close()
    assert episode.status == "ok" and episode.num_calls == 2
    assert len(samples) == 1 and len(samples[0].segments) == 2  # the two calls merged
    fields = episode_experience_fields(samples, metrics)
    assert len(fields) == 1
    f = fields[0]
    start = f["prompt_length"]
    assert f["tokens"] == samples[0].input_ids and not samples[0].loss_mask[start - 1]
    assert f["action_mask"] == [bool(m) for m in samples[0].loss_mask[start:]]
    assert f["action_mask"][0] and not all(f["action_mask"])  # the second user turn is not trained
    assert f["reward"] == 0.25 and f["metrics"]["ajet/workflow/turns"] == 2.0
    calls = [c for tl in episode.timelines for c in tl.completion_spans]
    assert sum(e - s for s, e in samples[0].segments) == sum(f["action_mask"]) <= sum(e - s for s, e in calls)


def test_cli_with_gpu_but_without_packages_names_the_gpu_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stub_run_conf: Callable[..., Path]) -> None:
    import importlib.util

    import ajet.gpus

    monkeypatch.setattr(ajet.gpus, "query_gpus", lambda: [{"index": 0, "total_mib": 80000, "used_mib": 0}])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("trinity", "vllm") else real_find_spec(name, *a))
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(stub_run_conf()), "--backbone=trinity"])
    assert result.exit_code == 1, result.output  # like the no-GPU case: this machine, not the config
    assert "'trinity' and 'vllm' packages" in result.output
    assert "ajet[trinity-gpu]" in result.output and "make env-trinity GPU=1" in result.output
    assert "Traceback" not in result.output
