"""ajet config -> verl overrides (a nested dict in verl's Hydra key names).

Key names follow `verl/trainer/config/_generated_ppo_trainer.yaml` of verl 0.9.1 (read
from the wheel; the sections used here exist since 0.5). Every key already exists in
verl's `ppo_trainer` config, so the dict is passed as plain Hydra overrides
(`key=value`, no `+`): Hydra itself rejects a key verl does not have. Pure: no verl import.

What runs where: verl's agent-loop workers run our `AjetAgentLoop` (registered through
`actor_rollout_ref.rollout.agent.agent_loop_config_path`) once per (task, repeat); it runs
one ajet episode through our TaskRunner, tracker and merge against verl's vLLM servers and
returns the merged sample (prompt = tokens before the first trained token, response = the
rest, response_mask = our loss mask); a failed episode returns none, so it is not in its
group's advantage statistics. verl's PPO trainer computes advantages and updates.
"""

from __future__ import annotations

from typing import Any

from ajet.algorithms.registry import get_algorithm
from ajet.backbones.gpu_checks import fsdp_problems
from ajet.backbones.gpu_config import flatten, run_dir
from ajet.config.schema import AjetConfig, LossAgg

AGENT_NAME = "ajet_agent"
AGENT_LOOP_TARGET = "ajet.backbones.verl.agent_loop.AjetAgentLoop"
VERL_VERSION = "0.9.1"
# verl sees one sequence per episode (merged), so "per episode" = "per sequence".
LOSS_AGG = {LossAgg.token_mean: "token-mean", LossAgg.episode_mean: "seq-mean-token-mean"}


def verl_dir(cfg: AjetConfig) -> str:
    return str(run_dir(cfg) / "verl")


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    """Settings that would do nothing (or cannot work) on the verl backbone (pure)."""
    problems = fsdp_problems(cfg, "verl")
    if not cfg.context.merge:
        problems.append(("context.merge", "=false cannot work on verl: its agent loop takes one "
                                          "sequence per episode, which merging provides"))
    if cfg.context.loss_agg == LossAgg.seq_mean:
        problems.append(("context.loss_agg", "=seq_mean (per LLM call) is not available on verl; "
                                             "use token_mean or episode_mean"))
    if cfg.rollout.drop_equal_reward_groups:
        problems.append(("rollout.drop_equal_reward_groups", "is not translated to verl's "
                                                             "trainer; remove it"))
    return problems


def _top_k(k: int) -> int:
    return k if k > 0 else -1


def to_verl_config(cfg: AjetConfig, *, model_path: str, resume: bool = False) -> dict[str, Any]:
    """verl overrides for this run as a nested dict (YAML-ready)."""
    tr, alg, ctx, v = cfg.trainer, cfg.algorithm, cfg.context, cfg.verl
    out_dir = verl_dir(cfg)
    # verl pads prompts (left) to max_prompt_length and responses (right) to
    # max_response_length; one merged sample never exceeds context.max_sample_tokens.
    max_len = ctx.max_sample_tokens
    loggers = ["console"]
    loggers += ["tensorboard"] if cfg.logging.tensorboard else []
    loggers += ["wandb"] if cfg.logging.wandb else []
    loggers += ["swanlab"] if cfg.logging.swanlab else []
    return {
        "algorithm": {
            "adv_estimator": get_algorithm(alg.name).backbone_names["verl"],
            "norm_adv_by_std_in_grpo": alg.norm_adv_by_std,
            "gamma": alg.gamma,
            "use_kl_in_reward": False,
        },
        "data": {
            "train_files": f"{out_dir}/train.parquet",
            "val_files": f"{out_dir}/val.parquet",
            "prompt_key": "prompt",
            "train_batch_size": tr.batch_size,
            "max_prompt_length": max_len,
            "max_response_length": max_len,
            "return_raw_chat": True,
            "shuffle": cfg.task_reader.shuffle,
            "seed": cfg.project.seed,
            "truncation": "error",
        },
        "actor_rollout_ref": _actor_rollout_ref(cfg, model_path, max_len),
        "trainer": {
            "project_name": cfg.project.name,
            "experiment_name": "verl",
            "logger": loggers,
            "n_gpus_per_node": v.n_gpus_per_node,
            "nnodes": v.nnodes,
            "total_epochs": 1_000_000,  # total_training_steps ends the run
            "total_training_steps": tr.total_steps,
            "save_freq": tr.save_every or -1,
            "test_freq": tr.val_every or -1,
            "val_before_train": bool(tr.val_every),
            "default_local_dir": f"{out_dir}/checkpoints",
            "max_actor_ckpt_to_keep": tr.keep_checkpoints or None,
            "resume_mode": "auto" if resume else "disable",
            # verl's v1 trainer (its default since 0.9): an agent loop may return no output, so a
            # failed episode leaves its GRPO group (convert.episode_outputs); the legacy trainer
            # needs one output per trajectory.
            "use_v1": True,
        },
    }


def _actor_rollout_ref(cfg: AjetConfig, model_path: str, max_len: int) -> dict[str, Any]:
    """verl's actor (the FSDP trainer: optimizer, loss terms) and its vLLM rollout with our agent loop."""
    r, tr, alg, ctx, v = cfg.rollout, cfg.trainer, cfg.algorithm, cfg.context, cfg.verl
    out_dir = verl_dir(cfg)
    lora = cfg.model.lora
    model: dict[str, Any] = {
        "path": model_path,
        "enable_gradient_checkpointing": tr.gradient_checkpointing,
        "use_remove_padding": True,
    }
    if lora.enabled:
        model.update({"lora_rank": lora.r, "lora_alpha": lora.alpha,
                      "target_modules": list(lora.target_modules)})
    return {
    "model": model,
    "actor": {
        "strategy": v.strategy,
        "optim": {
            "lr": tr.lr,
            "weight_decay": tr.weight_decay,
            "lr_warmup_steps": tr.warmup_steps if tr.warmup_steps > 0 else -1,
            "lr_scheduler_type": tr.lr_schedule.value,
            "clip_grad": tr.grad_clip,
        },
        "ppo_mini_batch_size": tr.batch_size,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": max(tr.micro_batch_tokens, 2 * max_len),
        "ppo_epochs": tr.ppo_epochs,
        "clip_ratio_low": alg.clip_ratio_low,
        "clip_ratio_high": alg.clip_ratio_high,
        "use_kl_loss": alg.kl_coef > 0,
        "kl_loss_coef": alg.kl_coef,
        "kl_loss_type": "low_var_kl",
        "entropy_coeff": alg.entropy_coef,
        "loss_agg_mode": LOSS_AGG.get(ctx.loss_agg, "token-mean"),
        "grad_clip": tr.grad_clip,
    },
    "rollout": {
        "name": "vllm",
        "mode": "async",
        "n": r.n,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": _top_k(r.top_k),
        "tensor_model_parallel_size": v.tensor_model_parallel_size,
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "max_model_len": ctx.max_model_len or None,
        "calculate_log_probs": True,
        "val_kwargs": {"n": tr.val_n, "temperature": r.temperature, "do_sample": True},
        "agent": {
            "num_workers": max(1, cfg.ray.num_rollout_workers),
            "default_agent_loop": AGENT_NAME,
            "agent_loop_config_path": f"{out_dir}/agent_loops.yaml",
        },
    },
}


def agent_loop_registry() -> list[dict[str, str]]:
    """The content of `agent_loop_config_path`: our agent loop under AGENT_NAME."""
    return [{"name": AGENT_NAME, "_target_": AGENT_LOOP_TARGET}]


def hydra_overrides(overrides: dict[str, Any]) -> list[str]:
    """`key=value` command-line overrides for `python -m verl.trainer.main_ppo` (pure)."""
    import json

    def render(value: Any) -> str:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return repr(value)
        if isinstance(value, list):
            return "[" + ",".join(render(v) for v in value) + "]"
        text = str(value)
        # Quote strings Hydra's override grammar would otherwise parse.
        if any(ch in text for ch in " ,[]{}()=:'\"\\$*") or text == "":
            return json.dumps(text)
        return text

    return [f"{key}={render(value)}" for key, value in flatten(overrides).items()]
