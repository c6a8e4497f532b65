"""ajet config -> Trinity-RFT config (a plain dict in Trinity's own key names).

Key names follow `trinity.common.config.Config` of trinity-rft 0.6.0 (read from the
wheel; 0.3-0.5 share these sections). Pure: no trinity import, no file written.

What runs where: Trinity's explorer runs our `AjetTrinityWorkflow` (the workflow plugin in
`ajet.backbones.trinity.workflow`, named by its dotted path, which Trinity's registry
imports) once per (task, repeat); the plugin runs one ajet episode through our TaskRunner,
tracker and merge against Trinity's vLLM OpenAI endpoint and returns the merged samples as
`Experience`s. Trinity's trainer (verl FSDP inside) does the update.
"""

from __future__ import annotations

from typing import Any

from ajet.algorithms.registry import get_algorithm
from ajet.backbones.gpu_checks import fsdp_problems
from ajet.backbones.gpu_config import lora_target_regex, run_dir
from ajet.config.schema import AjetConfig, LossAgg

WORKFLOW_TYPE = "ajet.backbones.trinity.workflow.AjetTrinityWorkflow"
TRINITY_VERSION = "0.6.0"
# Trinity's step-wise GRPO (an algorithm's `backbone_names["trinity"]`); `trinity.algorithm_type` picks its variant.
STEPWISE_GRPO = "multi_step_grpo"
# Trinity's loss_agg_mode names for ours (one Trinity experience = one merged sample).
LOSS_AGG = {
    LossAgg.token_mean: "token-mean",
    LossAgg.seq_mean: "seq-mean-token-mean",
}


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    """Settings that would do nothing (or cannot work) on the trinity backbone (pure)."""
    problems = fsdp_problems(cfg, "trinity")
    t = cfg.trinity
    if t.explorer_gpus < 1:
        problems.append(("trinity.explorer_gpus", "must be >= 1 (the rollout engine needs a GPU)"))
    if t.trainer_gpus < 0:
        problems.append(("trinity.trainer_gpus", "must be >= 0 (0 = share the explorer's GPU)"))
    if t.trainer_gpus == 0 and t.explorer_gpus != 1:
        problems.append(("trinity.trainer_gpus", "=0 (colocate: trainer and vLLM share one GPU) "
                                                 "needs trinity.explorer_gpus=1"))
    if stepwise_grpo(cfg) and not cfg.algorithm.norm_adv_by_std:
        problems.append(("algorithm.norm_adv_by_std", "=false has no effect on trinity: its "
                                                      "step-wise GRPO always divides by the "
                                                      "group std; remove it or use --backbone=verl"))
    if cfg.context.loss_agg == LossAgg.episode_mean:
        problems.append(("context.loss_agg", "=episode_mean is not available on trinity; use "
                                             "token_mean or seq_mean (per merged sample)"))
    if cfg.trainer.ppo_epochs != 1:
        problems.append(("trainer.ppo_epochs", "is not translated to trinity; remove it"))
    if cfg.algorithm.gamma != 1.0:
        problems.append(("algorithm.gamma", "is not translated to trinity; remove it"))
    return problems


def stepwise_grpo(cfg: AjetConfig) -> bool:
    """Whether the algorithm runs as Trinity's step-wise GRPO (its registry name for Trinity)."""
    return get_algorithm(cfg.algorithm.name).backbone_names.get("trinity") == STEPWISE_GRPO


def algorithm_type(cfg: AjetConfig) -> str:
    """Trinity's name for the algorithm; the step-wise GRPO's variant is `trinity.algorithm_type`'s."""
    return cfg.trinity.algorithm_type if stepwise_grpo(cfg) else get_algorithm(cfg.algorithm.name).backbone_names["trinity"]


def to_trinity_config(cfg: AjetConfig, *, model_path: str, resume: bool = False) -> dict[str, Any]:
    """The Trinity `Config` for this run as a nested dict (YAML-ready)."""
    t, r, tr = cfg.trinity, cfg.rollout, cfg.trainer
    colocate = t.trainer_gpus == 0
    monitor = "wandb" if cfg.logging.wandb else "swanlab" if cfg.logging.swanlab else "tensorboard"
    return {
        "mode": "colocate" if colocate else "both",
        "project": cfg.project.name,
        "group": "",
        "name": "trinity",
        # checkpoint_job_dir = checkpoint_root_dir/project/group/name = RUN/trinity
        "checkpoint_root_dir": str(run_dir(cfg).parent),
        "continue_from_checkpoint": resume,
        "algorithm": _algorithm(cfg),
        "model": _model(cfg, model_path),
        "cluster": {
            "ray_address": cfg.ray.address or "auto",
            "node_num": 1,
            "gpu_per_node": t.explorer_gpus + t.trainer_gpus,
        },
        "buffer": {
            "batch_size": tr.batch_size,
            "total_steps": tr.total_steps,
            "total_epochs": 1_000_000,  # total_steps ends the run, not epochs
            "explorer_input": _explorer_input(cfg),
            "trainer_input": {
                "experience_buffer": {"name": "ajet_experiences", "storage_type": "queue"},
            },
        },
        "explorer": {
            "runner_per_model": max(1, r.max_concurrency),
            "max_timeout": int(r.episode_timeout_s),
            "max_retry_times": r.max_retries,
            "concurrent_mode": "asynchronous",
            "eval_interval": tr.val_every or tr.total_steps + 1,
            "eval_on_startup": bool(tr.val_every),
            "rollout_model": {
                "engine_type": "vllm",
                "engine_num": t.explorer_gpus,
                "tensor_parallel_size": 1,
                "enable_openai_api": True,
                "enable_history": False,
                "seed": cfg.project.seed,
            },
        },
        "trainer": {
            "trainer_type": "verl",
            "save_interval": tr.save_every,
            "total_steps": tr.total_steps,
            "grad_clip": tr.grad_clip,
            "max_token_len_per_gpu": tr.micro_batch_tokens,
            "max_checkpoints_to_keep": tr.keep_checkpoints,
            "save_hf_checkpoint": "last" if tr.save_final_model else "never",
        },
        "synchronizer": {
            "sync_method": "memory" if colocate else t.sync_method,
            "sync_interval": t.sync_interval,
        },
        "monitor": {"monitor_type": monitor},
        "log": {"level": cfg.logging.level},
    }


def _explorer_input(cfg: AjetConfig) -> dict[str, Any]:
    """The train taskset (the tasks ajet exported, run by our workflow plugin) and the validation one."""
    r, tr = cfg.rollout, cfg.trainer
    generation = {
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k if r.top_k > 0 else -1,
        "logprobs": 0,
        "max_tokens": r.max_tokens,
    }
    workflow_args = {"ajet_config": str(run_dir(cfg) / "config.yaml")}
    taskset = {
        "name": "ajet_train",
        "storage_type": "file",
        "path": str(run_dir(cfg) / "tasks"),
        "split": "train",
        "default_workflow_type": WORKFLOW_TYPE,
        "workflow_args": workflow_args,
        "rollout_args": generation,
    }
    explorer_input: dict[str, Any] = {"taskset": taskset}
    if tr.val_every:
        explorer_input["eval_tasksets"] = [{
            **taskset, "name": "ajet_val", "split": "validation", "repeat_times": tr.val_n,
        }]
    return explorer_input


def _algorithm(cfg: AjetConfig) -> dict[str, Any]:
    """Trinity's algorithm section: the algorithm's name for it, the optimizer, the loss terms."""
    r, tr, alg = cfg.rollout, cfg.trainer, cfg.algorithm
    algorithm: dict[str, Any] = {
        "algorithm_type": algorithm_type(cfg),
        "repeat_times": r.n,
        "optimizer": {
            "lr": tr.lr,
            "lr_warmup_steps": tr.warmup_steps,
            "lr_scheduler_type": tr.lr_schedule.value,
            "weight_decay": tr.weight_decay,
            "clip_grad": tr.grad_clip,
        },
        "policy_loss_fn": "ppo",
        "policy_loss_fn_args": {
            "clip_range_low": alg.clip_ratio_low,
            "clip_range_high": alg.clip_ratio_high,
        },
        "kl_loss_fn": "k3" if alg.kl_coef > 0 else "none",
        "kl_loss_fn_args": {"kl_coef": alg.kl_coef},
        "entropy_loss_fn": "default",
        "entropy_loss_fn_args": {"entropy_coef": alg.entropy_coef},
        "loss_agg_mode": LOSS_AGG.get(cfg.context.loss_agg, "token-mean"),
    }
    if stepwise_grpo(cfg) and r.drop_equal_reward_groups:
        # Groups whose reward std is 0 carry no signal: the step-wise GRPO skips them.
        algorithm["advantage_fn_args"] = {"std_threshold": 0.0}
    return algorithm


def _model(cfg: AjetConfig, model_path: str) -> dict[str, Any]:
    """Trinity's model section: the checkpoint, the generation window and sampling, LoRA."""
    r = cfg.rollout
    model: dict[str, Any] = {
        "model_path": model_path,
        "max_response_tokens": r.max_tokens,
        "max_model_len": cfg.context.max_model_len or cfg.context.max_sample_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k if r.top_k > 0 else -1,
    }
    lora = cfg.model.lora
    if lora.enabled:
        model["lora_configs"] = [{
            "name": "ajet_lora",
            "lora_rank": lora.r,
            "lora_alpha": lora.alpha,
            "target_modules": lora_target_regex(list(lora.target_modules)),
        }]
    return model
