"""The SFT recipe: agent dialogs -> masked samples -> coreset -> planned batches -> updates.

setup: read dialogs, load the model (full or LoRA), render samples with loss on assistant
turns, select a coreset, plan every batch (rounds, replay, mixture), build the optimizer.
train (`ajet.training.TrainingLoop`): one optimizer step per planned batch; dev loss at step
0, every `sft.eval_every` steps (or at each epoch end) and at the end.
Outputs (docs/outputs.md): RUN/config.yaml, metrics.jsonl, checkpoints/, final_model/.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from ajet.config import AjetConfig
from ajet.context.budget import apply_budget
from ajet.context.diagnostics import probe_template
from ajet.context.types import Sample
from ajet.engine.chat import ChatFormat
from ajet.own_thread import in_own_thread
from ajet.sft.coreset import dialog_stats, fill_losses, select_coreset, selection_summary
from ajet.sft.data import Dialog, DialogDataError, read_dialogs, split_dev
from ajet.sft.masks import dialog_samples
from ajet.sft.schedule import plan_batches
from ajet.sft.step import mean_nll, sample_nll, sft_step
from ajet.training.loop import TrainingLoop
from ajet.training.model import load_trainable_model, model_window
from ajet.training.optim import build_optimizer
from ajet.training.recipe import Closers, run_recipe
from ajet.training.run_dir import prepare_run_dir
from ajet.training.step import OptimizerStep, resolve_bf16

log = logging.getLogger(__name__)


def train_sft(cfg: AjetConfig, *, resume: bool = False) -> Path:
    """Run the SFT stage; return the run directory (the model is in RUN/final_model)."""
    return run_recipe(SftRecipe(cfg, resume=resume))


class SftRecipe:
    def __init__(self, cfg: AjetConfig, *, resume: bool = False) -> None:
        self.cfg = cfg
        self.resume = resume

    # ------------------------------------------------------------------ setup
    def setup(self, closers: Closers) -> None:
        cfg = self.cfg
        self.run_dir = prepare_run_dir(cfg, resume=self.resume)
        train_dialogs, dev_dialogs = self._read_dialogs()
        self.model, self.tokenizer = load_trainable_model(
            cfg.model, seed=cfg.project.seed, gradient_checkpointing=cfg.trainer.gradient_checkpointing,
            keep_matmuls=cfg.trainer.checkpoint_keep_matmuls)
        self.window = model_window(self.model, cfg.context.max_model_len)
        self.chat = ChatFormat(self.tokenizer)
        self.dialogs, self.samples, budget = self._render(train_dialogs)
        _, self.dev_samples, _ = self._render(dev_dialogs)
        self.selected, self.setup_metrics = self._select()
        self.setup_metrics.update(budget)
        self.schedule = self._plan()
        trainer_cfg = dataclasses.replace(cfg.trainer, total_steps=len(self.schedule))
        optimizer, scheduler = build_optimizer(self.model, trainer_cfg, seed=cfg.project.seed)
        self.optimizer = optimizer
        self.optimizer_step = OptimizerStep(self.model, optimizer, trainer_cfg)
        self.training_loop = TrainingLoop(cfg, self.run_dir, closers, total_steps=len(self.schedule), resume=self.resume)
        self.training_loop.attach(self.model, self.tokenizer, optimizer, scheduler,
                         state=lambda step: {"schedule_len": len(self.schedule)})
        self.optimizer_step.keep_in(self.training_loop)
        if self.resume and (state := self.training_loop.restore()) is not None:
            if state.get("schedule_len") != len(self.schedule):
                raise DialogDataError(
                    f"the checkpoint was written for a schedule of {state.get('schedule_len')} steps, this "
                    f"config plans {len(self.schedule)}: the data or the sft settings changed. Start a new run.")
        log.info("sft: %d dialogs (%d selected), %d dev, %d optimizer steps", len(self.dialogs),
                 len(self.selected), len(dev_dialogs), len(self.schedule))

    def _read_dialogs(self) -> tuple[list[Dialog], list[Dialog]]:
        sft = self.cfg.sft
        if not sft.train_path:
            raise DialogDataError("sft.train_path is empty; point it at a JSONL file of dialogs")
        train = read_dialogs(sft.train_path)
        if sft.dev_path:
            return train, read_dialogs(sft.dev_path)
        return split_dev(train, sft.dev_fraction, self.cfg.project.seed)

    def _render(self, dialogs: list[Dialog]) -> tuple[list[Dialog], list[list[Sample]], dict[str, float]]:
        """Samples per dialog within the token budget; dialogs left with nothing to train are dropped."""

        probe = probe_template(self.chat)
        kept_dialogs, kept_samples = [], []
        totals: dict[str, float] = {}
        for dialog in dialogs:
            try:
                samples = dialog_samples(dialog, self.chat, probe)
            except ValueError as exc:
                where = "" if dialog.dialog_id in str(exc) else f"dialog {dialog.dialog_id}: "
                raise DialogDataError(f"{where}{exc}") from None
            samples, counts = apply_budget(samples, self.cfg.context, self.window)
            for key, value in counts.items():
                totals[f"sft/{key}"] = totals.get(f"sft/{key}", 0.0) + value
            samples = [s for s in samples if any(s.loss_mask)]
            if samples:
                kept_dialogs.append(dialog)
                kept_samples.append(samples)
        return kept_dialogs, kept_samples, totals

    def _select(self) -> tuple[list[int], dict[str, float]]:
        coreset = self.cfg.sft.coreset
        losses: list[float | None] = [d.loss for d in self.dialogs]
        if coreset.strategy.value in ("loss_topk", "hybrid"):
            losses = fill_losses(losses, self._model_losses)
        tokens = [[t for s in samples for t in s.input_ids] for samples in self.samples]
        stats = dialog_stats(tokens, losses, coreset.ngram)
        chosen = select_coreset(stats, coreset.strategy.value, coreset.size, seed=self.cfg.project.seed,
                                hybrid_alpha=coreset.hybrid_alpha)
        return chosen, selection_summary(stats, chosen)

    def _model_losses(self, indices: list[int]) -> list[float]:
        """The model's mean loss per trained token of each of these dialogs."""

        flat = [(i, s) for i in indices for s in self.samples[i]]
        nll = in_own_thread(sample_nll, self.model, [s for _, s in flat], micro_batch_tokens=self._pack_tokens(),
                                bf16=resolve_bf16(self.cfg.trainer.bf16, self.model), logits_chunk=self.cfg.trainer.logits_chunk_tokens)
        sums = {i: [0.0, 0] for i in indices}
        for (i, _), (total, count) in zip(flat, nll, strict=True):
            sums[i][0] += total
            sums[i][1] += count
        return [total / count if count else 0.0 for total, count in (sums[i] for i in indices)]

    def _plan(self) -> list[Any]:
        sft = self.cfg.sft
        batches = plan_batches(
            self.selected, [d.task_type for d in self.dialogs], rounds=sft.rounds, epochs=sft.epochs,
            batch_size=sft.batch_size, task_weights=dict(sft.task_weights),
            replay_size=sft.replay.buffer_size, replay_ratio=sft.replay.ratio, seed=self.cfg.project.seed,
        )
        if not batches:
            raise DialogDataError("the SFT schedule is empty: every dialog was dropped (task weights 0, "
                                  "coreset size, or longer than context.max_sample_tokens)")
        return batches

    def _pack_tokens(self) -> int:
        return self.cfg.trainer.micro_batch_tokens if self.cfg.context.tree_packing else 0

    # ------------------------------------------------------------------ train
    def train(self) -> Path:
        if self.training_loop.step == 0:
            self.training_loop.log(self.setup_metrics)
        with self.training_loop.steps(validate=self.dev_loss, validate_at=self.dev_loss_at) as steps:
            for step in steps:  # one optimizer step on each planned batch of dialogs
                self.training_loop.commit(self.train_step(step))
        return self.run_dir

    def dev_loss_at(self, step: int) -> bool:
        """Before the first step, every `sft.eval_every` steps (0: at each epoch end), at the end."""
        every = self.cfg.sft.eval_every
        if step == 0 or step == len(self.schedule):
            return True
        if every:
            return step % every == 0
        batch, nxt = self.schedule[step - 1], self.schedule[step]
        return (nxt.round, nxt.epoch) != (batch.round, batch.epoch)

    def train_step(self, step: int) -> dict[str, float]:
        start = time.monotonic()
        batch = self.schedule[step - 1]
        samples = [s for i in batch.indices for s in self.samples[i]]
        # In a thread of its own, whose OpenMP pool ends with it (ajet/own_thread.py).
        metrics = in_own_thread(sft_step, self.optimizer_step, samples, loss_agg=self.cfg.context.loss_agg,
                                    micro_batch_tokens=self._pack_tokens(),
                                    logits_chunk=self.cfg.trainer.logits_chunk_tokens, step=step)
        metrics.update({
            "sft/dialogs": float(len(batch.indices)),
            "sft/round": float(batch.round),
            "sft/epoch": float(batch.epoch),
            "perf/step_time_s": time.monotonic() - start,
        })
        return metrics

    def dev_loss(self) -> float | None:
        if not self.dev_samples:
            return None
        flat = [s for samples in self.dev_samples for s in samples]
        loss = mean_nll(in_own_thread(sample_nll, self.model, flat, micro_batch_tokens=self._pack_tokens(),
                                          bf16=resolve_bf16(self.cfg.trainer.bf16, self.model),
                                          logits_chunk=self.cfg.trainer.logits_chunk_tokens))
        self.training_loop.log({"val/sft/loss": loss, "val/sft/dialogs": float(len(self.dev_samples))}, split="val")
        log.info("sft dev loss at step %d: %.4f", self.training_loop.step, loss)
        return loss
