"""The online DPO recipe: rollouts -> best-vs-worst pairs per task -> one DPO step per batch.

setup: workflow, tasks, model (full or LoRA), the reference (a frozen copy of the
stage's initial model, or the LoRA base; none when reference-free), the rollout stack.
train (`ajet.training.TrainingLoop`): per step, `trainer.batch_size` tasks x `rollout.n`
episodes; pairs where rewards differ; `dpo_step`; the engine shares the model, so a weight
sync is a version bump.
Outputs as the RL recipe (docs/outputs.md): config.yaml, metrics.jsonl, checkpoints/, final_model/.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ajet.config import AjetConfig
from ajet.training.recipe import Closers, run_recipe

log = logging.getLogger(__name__)


def train_dpo(cfg: AjetConfig, *, resume: bool = False, workflow: Any = None) -> Path:
    """Run the DPO stage; return the run directory (the model is in RUN/final_model)."""
    return run_recipe(DpoRecipe(cfg, workflow=workflow, resume=resume))


class DpoRecipe:
    def __init__(self, cfg: AjetConfig, *, workflow: Any = None, resume: bool = False) -> None:
        self.cfg = cfg
        self.workflow_arg = workflow
        self.resume = resume

    def setup(self, closers: Closers) -> None:
        from ajet.algorithms.reference import ReferencePolicy
        from ajet.rollout.loader import load_or_wrap_workflow
        from ajet.rollout.local import LocalRollout
        from ajet.task_reader import build_reader
        from ajet.training.loop import TrainingLoop
        from ajet.training.model import load_trainable_model, model_window
        from ajet.training.optim import build_optimizer
        from ajet.training.run_dir import prepare_run_dir

        cfg = self.cfg
        self.run_dir = prepare_run_dir(cfg, resume=self.resume)
        self.workflow = load_or_wrap_workflow(self.workflow_arg, cfg.workflow.target)
        self.reader = build_reader(cfg.task_reader, seed=cfg.project.seed)
        self.loop = TrainingLoop(cfg, self.run_dir, closers, total_steps=cfg.trainer.total_steps,
                                 resume=self.resume)
        self.model, self.tokenizer = load_trainable_model(
            cfg.model, seed=cfg.project.seed, gradient_checkpointing=cfg.trainer.gradient_checkpointing)
        self.window = model_window(self.model, cfg.context.max_model_len)
        a = cfg.algorithm
        # Built before any update: the stage's initial policy.
        self.reference = None if a.dpo_reference_free else ReferencePolicy(self.model, a.dpo_reference.value)
        self.rollout = LocalRollout(cfg, self.model, self.tokenizer, self.workflow, model_max_len=self.window)
        closers.push(self.rollout.close, "rollout")
        self.optimizer, scheduler = build_optimizer(self.model, cfg.trainer, seed=cfg.project.seed)
        self.loop.attach(self.model, self.tokenizer, self.optimizer, scheduler,
                         state=lambda: {"reader": self.reader.state_dict()})
        if self.resume and (state := self.loop.restore()) is not None:
            self.reader.load_state_dict(state["reader"])
            self.rollout.engine.bump_version()

    def train(self) -> Path:
        self.loop.run(self.train_step, validate=self.validate)
        return self.run_dir

    def train_step(self, step: int) -> dict[str, float]:
        from ajet.dpo.pairs import build_pair_batch
        from ajet.dpo.step import dpo_step

        cfg = self.cfg
        start = time.monotonic()
        tasks = self.reader.next_batch(cfg.trainer.batch_size)
        self.loop.phase(f"step {step}: rollout of {len(tasks)} tasks × {cfg.rollout.n}")
        result = self.rollout.rollout(tasks, cfg.rollout.n, episode_prefix=f"s{step}-")
        metrics = dict(result.metrics())
        metrics["perf/rollout_s"] = time.monotonic() - start
        batch = build_pair_batch(result.ok_episodes, cfg.context, model_max_len=self.window)
        metrics.update(batch.metrics)
        if not batch.num_pairs:
            metrics["actor/skipped_update"] = 1.0
            log.info("dpo step %d: no pair (every task's episodes scored the same); weights unchanged", step)
        else:
            self.loop.phase(f"step {step}: update on {batch.num_pairs} pairs")
            micro = cfg.trainer.micro_batch_tokens if cfg.context.tree_packing else 0
            with self.rollout.engine.paused():
                self.rollout.engine.drop_prefix_cache()  # invalid after the update: free it for the update
                metrics.update(dpo_step(self.model, self.reference, batch, self.optimizer, cfg.algorithm,
                                        micro_batch_tokens=micro, grad_clip=cfg.trainer.grad_clip,
                                        bf16=cfg.trainer.bf16, logits_chunk=cfg.trainer.logits_chunk_tokens))
                self.rollout.engine.bump_version()
        metrics["perf/step_time_s"] = time.monotonic() - start
        return metrics

    def validate(self) -> dict[str, float]:
        from ajet.training.validation import validate_on_rollout

        return validate_on_rollout(self.loop, self.reader, self.rollout.rollout, self.cfg.trainer.val_n)
