"""Checks across keys that types alone cannot express (impossible combinations).

Each check returns (dotted key, message that says what would be valid).
"""

from __future__ import annotations

from pathlib import Path

from ajet.config.schema import (
    BUILTIN_JUDGES,
    GROUP_ALGORITHMS,
    AjetConfig,
    ReaderType,
    ReferenceModel,
)
from ajet.config.stages import needs_workflow, stage_problems


def validate(cfg: AjetConfig, *, require_workflow: bool = True) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = stage_problems(cfg)
    require_workflow = require_workflow and needs_workflow(cfg)

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            problems.append((key, msg))

    need(bool(cfg.model.path), "model.path", "empty; use 'smollm2-135m-instruct' or a local checkpoint dir")
    need(cfg.model.lora.r > 0, "model.lora.r", "must be > 0")

    if require_workflow:
        need(
            bool(cfg.workflow.target),
            "workflow.target",
            "required: 'package.module:ClassName' or 'file.py:ClassName' (relative to the YAML)",
        )
    if cfg.workflow.target:
        need(
            ":" in cfg.workflow.target,
            "workflow.target",
            f"'{cfg.workflow.target}' must be 'package.module:ClassName' or 'file.py:ClassName'",
        )
        file_part = cfg.workflow.target.rpartition(":")[0]
        if file_part.endswith(".py"):
            need(Path(file_part).is_file(), "workflow.target", f"file not found: {file_part}")

    judge = cfg.judge.type
    need(
        judge in BUILTIN_JUDGES or ":" in judge,
        "judge.type",
        f"'{judge}' is not one of {BUILTIN_JUDGES} nor 'module:ClassName'",
    )

    r = cfg.rollout
    need(r.n >= 1, "rollout.n", "must be >= 1")
    need(r.max_concurrency >= 1, "rollout.max_concurrency", "must be >= 1")
    need(r.episode_timeout_s > 0, "rollout.episode_timeout_s", "must be > 0 seconds")
    need(r.max_retries >= 0, "rollout.max_retries", "must be >= 0")
    need(r.temperature >= 0, "rollout.temperature", "must be >= 0 (0 = greedy)")
    need(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    need(r.top_k >= 0, "rollout.top_k", "must be >= 0 (0 = off)")
    need(r.max_tokens >= 1, "rollout.max_tokens", "must be >= 1")
    need(r.dynamic_sampling.max_rounds >= 1, "rollout.dynamic_sampling.max_rounds", "must be >= 1")
    need(cfg.serve.max_staleness >= 0, "serve.max_staleness", "must be >= 0 (0 = fully on-policy)")
    need(0 <= cfg.serve.port <= 65535, "serve.port", "must be in 0..65535 (0 = a free port)")
    need(
        r.max_tokens <= cfg.context.max_call_tokens,
        "rollout.max_tokens",
        f"{r.max_tokens} exceeds context.max_call_tokens={cfg.context.max_call_tokens}; "
        "raise context.max_call_tokens or lower rollout.max_tokens",
    )
    need(
        cfg.context.max_call_tokens <= cfg.context.max_sample_tokens,
        "context.max_call_tokens",
        "must be <= context.max_sample_tokens",
    )

    a = cfg.algorithm
    if a.name in GROUP_ALGORITHMS:
        need(
            r.n >= 2,
            "rollout.n",
            f"{a.name.value} compares episodes of the same task, so rollout.n must be >= 2 "
            "(e.g. rollout.n=4), or use algorithm.name=reinforce_pp",
        )
    need(a.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0")
    if a.kl_coef > 0 and a.kl_reference == ReferenceModel.lora_base:
        need(
            cfg.model.lora.enabled,
            "algorithm.kl_reference",
            "'lora_base' needs model.lora.enabled=true; use 'frozen' for full fine-tuning",
        )
    need(0 <= a.clip_ratio_low < 1, "algorithm.clip_ratio_low", "must be in [0, 1)")
    need(a.clip_ratio_high >= 0, "algorithm.clip_ratio_high", "must be >= 0")
    need(0 < a.gamma <= 1, "algorithm.gamma", "must be in (0, 1]")

    t = cfg.trainer
    need(t.total_steps >= 1, "trainer.total_steps", "must be >= 1")
    need(t.batch_size >= 1, "trainer.batch_size", "must be >= 1")
    need(t.lr > 0, "trainer.lr", "must be > 0")
    need(t.micro_batch_tokens >= 16, "trainer.micro_batch_tokens", "must be >= 16")
    need(t.ppo_epochs >= 1, "trainer.ppo_epochs", "must be >= 1")
    need(t.val_n >= 1, "trainer.val_n", "must be >= 1")

    tr = cfg.task_reader
    need(0 <= tr.val_fraction < 1, "task_reader.val_fraction", "must be in [0, 1)")
    if tr.type == ReaderType.jsonl and require_workflow:
        need(bool(tr.jsonl.train_path), "task_reader.jsonl.train_path", "required for the jsonl reader")
    for key, value in (
        ("task_reader.jsonl.train_path", tr.jsonl.train_path),
        ("task_reader.jsonl.val_path", tr.jsonl.val_path),
    ):
        if tr.type == ReaderType.jsonl and value:
            need(Path(value).is_file(), key, f"file not found: {value}")
    if tr.type == ReaderType.hf_dataset:
        need(bool(tr.hf_dataset.path), "task_reader.hf_dataset.path", "required for hf_dataset")
        if tr.hf_dataset.path:
            need(Path(tr.hf_dataset.path).exists(), "task_reader.hf_dataset.path",
                 f"not found: {tr.hf_dataset.path} (only local files; nothing is downloaded)")
    if tr.type == ReaderType.generate:
        need(bool(tr.generate.documents), "task_reader.generate.documents", "list at least one text file")
        for doc in tr.generate.documents:
            need(Path(doc).is_file(), "task_reader.generate.documents", f"file not found: {doc}")
    return problems
