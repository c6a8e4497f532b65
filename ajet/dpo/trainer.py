"""The online DPO stage: rollouts -> best-vs-worst pairs per task -> one DPO step per batch.

setup: workflow, tasks, model (full or LoRA), the reference (a frozen copy of the
stage's initial model, or the LoRA base; none when reference-free), the rollout stack.
train: per step, `trainer.batch_size` tasks x `rollout.n` episodes; pairs where rewards
differ; `dpo_step`; the engine shares the model, so a weight sync is a version bump.
Outputs as the RL trainer (docs/outputs.md): config.yaml, metrics.jsonl, checkpoints/, final_model/.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ajet.config import AjetConfig, to_yaml

log = logging.getLogger(__name__)


def train_dpo(cfg: AjetConfig, *, resume: bool = False, workflow: Any = None) -> Path:
    trainer = DpoTrainer(cfg, workflow=workflow)
    trainer.setup(resume=resume)
    try:
        trainer.train()
    finally:
        trainer.cleanup()
    return trainer.run_dir


class DpoTrainer:
    def __init__(self, cfg: AjetConfig, *, workflow: Any = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.project.exp_dir) / cfg.project.name
        self._workflow_arg = workflow
        self.step = 0
        self._closers: list[Any] = []

    def setup(self, *, resume: bool) -> None:
        from ajet.algorithms.reference import ReferencePolicy
        from ajet.backbones.debug.update import build_optimizer
        from ajet.eval.rollout import LocalRollout
        from ajet.logging.metrics import MetricsLogger
        from ajet.rollout.loader import as_workflow, load_workflow
        from ajet.sft.model import load_trainable_model, model_window
        from ajet.sft.trainer import prepare_run_dir
        from ajet.task_reader import build_reader

        cfg = self.cfg
        prepare_run_dir(self.run_dir, cfg, resume=resume)
        self.workflow = (as_workflow(self._workflow_arg) if self._workflow_arg is not None
                         else load_workflow(cfg.workflow.target))
        self.reader = build_reader(cfg.task_reader, seed=cfg.project.seed)
        self.model, self.tokenizer = load_trainable_model(
            cfg.model, seed=cfg.project.seed, gradient_checkpointing=cfg.trainer.gradient_checkpointing)
        self.window = model_window(self.model, cfg.context.max_model_len)
        a = cfg.algorithm
        # Built before any update: the stage's initial policy.
        self.reference = None if a.dpo_reference_free else ReferencePolicy(self.model, a.dpo_reference)
        self.stack = LocalRollout(cfg, self.model, self.tokenizer, self.workflow, model_max_len=self.window)
        self._closers.append(self.stack.close)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.trainer)
        if resume:
            self._resume()
        self.metrics = MetricsLogger(self.run_dir, cfg.logging, run_name=cfg.project.name,
                                     config_dict={"yaml": to_yaml(cfg)})
        self._closers.append(self.metrics.close)

    def _resume(self) -> None:
        from ajet.backbones.debug.checkpoint import latest_checkpoint, load_checkpoint

        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            log.warning("--resume: no checkpoint under %s; starting from step 0", self.run_dir)
            return
        state = load_checkpoint(ckpt, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        self.step = int(state["step"])
        self.reader.load_state_dict(state["reader"])
        self.stack.engine.bump_version()

    def train(self) -> None:
        t = self.cfg.trainer
        if self.step == 0 and t.val_every:
            self.validate()
        while self.step < t.total_steps:
            metrics = self.train_step(self.step + 1)
            self.step += 1
            self.metrics.log(self.step, metrics)
            log.info("dpo step %d/%d  pairs %d  loss %s  reward %.3f", self.step, t.total_steps,
                     int(metrics["dpo/pairs"]), f"{metrics['dpo/loss']:.4f}" if "dpo/loss" in metrics else "-",
                     metrics.get("reward/mean", float("nan")))
            if t.val_every and self.step % t.val_every == 0:
                self.validate()
            if t.save_every and self.step % t.save_every == 0 and self.step < t.total_steps:
                self.save_checkpoint()
        self.save_checkpoint()
        if t.save_final_model:
            from ajet.sft.model import save_final_model

            save_final_model(self.model, self.tokenizer, self.run_dir / "final_model", lora=self.cfg.model.lora.enabled)

    def train_step(self, step: int) -> dict[str, float]:
        from ajet.dpo.pairs import build_pair_batch
        from ajet.dpo.step import dpo_step

        cfg = self.cfg
        start = time.monotonic()
        tasks = self.reader.next_batch(cfg.trainer.batch_size)
        result = self.stack.rollout(tasks, cfg.rollout.n, episode_prefix=f"s{step}-")
        metrics = dict(result.metrics())
        metrics["perf/rollout_s"] = time.monotonic() - start
        batch = build_pair_batch(result.ok_episodes, cfg.context, model_max_len=self.window)
        metrics.update(batch.metrics)
        if not batch.num_pairs:
            metrics["actor/skipped_update"] = 1.0
            log.info("dpo step %d: no pair (every task's episodes scored the same); weights unchanged", step)
        else:
            micro = cfg.trainer.micro_batch_tokens if cfg.context.tree_packing else 0
            with self.stack.engine.paused():
                metrics.update(dpo_step(self.model, self.reference, batch, self.optimizer, cfg.algorithm,
                                        micro_batch_tokens=micro, grad_clip=cfg.trainer.grad_clip,
                                        bf16=cfg.trainer.bf16))
            self.stack.engine.bump_version()
        self.scheduler.step()
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        metrics["perf/step_time_s"] = time.monotonic() - start
        return metrics

    def validate(self) -> dict[str, float]:
        from ajet.backbones.debug.trainer import validation_metrics

        tasks = self.reader.val_tasks()
        if not tasks:
            return {}
        k = self.cfg.trainer.val_n
        result = self.stack.rollout(tasks, k, episode_prefix=f"val{self.step}-")
        metrics = validation_metrics(result.episodes, k)
        self.metrics.log(self.step, metrics, split="val")
        return metrics

    def save_checkpoint(self) -> None:
        from ajet.backbones.debug.checkpoint import save_checkpoint

        save_checkpoint(self.run_dir / "checkpoints", self.step, model=self.model, optimizer=self.optimizer,
                        scheduler=self.scheduler, extra={"reader": self.reader.state_dict()},
                        keep_last=self.cfg.trainer.keep_checkpoints)

    def cleanup(self) -> None:
        for close in reversed(self._closers):
            close()
        self._closers.clear()
