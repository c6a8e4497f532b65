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

from ajet.algorithms.reference import ReferencePolicy
from ajet.config import AjetConfig
from ajet.dpo.pairs import build_pair_batch
from ajet.dpo.step import dpo_step
from ajet.own_thread import in_own_thread
from ajet.training.recipe import Closers, run_recipe
from ajet.training.rollout_run import RolloutRun
from ajet.training.step import OptimizerStep, updating_weights
from ajet.training.validation import validate_on_rollout

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
        cfg = self.cfg
        run = RolloutRun.start(cfg, closers, resume=self.resume, workflow=self.workflow_arg)
        self.run_dir, self.reader, self.training_loop, self.model = run.run_dir, run.reader, run.training_loop, run.model
        self.window, self.rollout = run.window, run.rollout
        a = cfg.algorithm
        # Built before any update (and before a resumed run's weights load): the stage's initial policy.
        self.reference = None if a.dpo_reference_free else ReferencePolicy(self.model, a.dpo_reference.value)
        self.optimizer_step = OptimizerStep(self.model, run.optimizer, cfg.trainer)
        self.optimizer_step.keep_in(self.training_loop)
        if self.resume:
            run.restore()

    def train(self) -> Path:
        with self.training_loop.steps(validate=self.validate) as steps:
            for step in steps:  # roll out -> pairs -> one DPO optimizer step -> commit
                self.training_loop.commit(self.train_step(step))
        return self.run_dir

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        start = time.monotonic()
        tasks = self.reader.next_batch(cfg.trainer.batch_size)
        self.training_loop.phase(f"step {step}: rollout of {len(tasks)} tasks × {cfg.rollout.n}")
        result = self.rollout.rollout(tasks, cfg.rollout.n, episode_prefix=f"s{step}-")
        metrics = dict(result.metrics())
        metrics["perf/rollout_s"] = time.monotonic() - start
        batch = build_pair_batch(result.ok_episodes, cfg.context, model_max_len=self.window)
        metrics.update(batch.metrics)
        if not batch.num_pairs:
            metrics["actor/skipped_update"] = 1.0
            log.info("dpo step %d: no pair (every task's episodes scored the same); weights unchanged", step)
        else:
            self.training_loop.phase(f"step {step}: update on {batch.num_pairs} pairs")
            micro = cfg.trainer.micro_batch_tokens if cfg.context.tree_packing else 0
            with updating_weights(self.rollout.engine):
                # In a thread of its own, whose OpenMP pool ends with it (ajet/own_thread.py).
                metrics.update(in_own_thread(dpo_step, self.optimizer_step, self.reference, batch, cfg.algorithm,
                                                 micro_batch_tokens=micro,
                                                 logits_chunk=cfg.trainer.logits_chunk_tokens, step=step))
        metrics["perf/step_time_s"] = time.monotonic() - start
        return metrics

    def validate(self) -> dict[str, float]:
        return validate_on_rollout(self.training_loop, self.reader, self.rollout.rollout, self.cfg.trainer.val_n)
