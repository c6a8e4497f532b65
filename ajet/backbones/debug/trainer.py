"""The debug backbone's training loop: setup -> train -> cleanup, in one process.

One step: read tasks -> run episodes (the engine batches every episode's calls) ->
merge and pack samples -> advantages -> update the shared weights -> bump the
policy version. The engine and the trainer share one model object, so a weight
sync is a version bump.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from ajet.config import AjetConfig, to_yaml
from ajet.config.schema import Algorithm

log = logging.getLogger(__name__)

RL_ALGORITHMS = (Algorithm.grpo, Algorithm.rloo, Algorithm.reinforce_pp, Algorithm.ppo)


def train(cfg: AjetConfig, *, with_ray: bool = False, resume: bool = False, workflow: Any = None,
          episode_source: Any = None) -> Path:
    """Train on the debug backbone; return the run directory. `episode_source(trainer)` (`ajet serve`)
    builds what gives each step's episodes (`next_batch(step)`) instead of the rollout manager."""
    trainer = DebugTrainer(cfg, workflow=workflow, with_ray=with_ray, episode_source=episode_source)
    trainer.setup(resume=resume)
    try:
        trainer.train()
    finally:
        trainer.cleanup()
    return trainer.run_dir


class DebugTrainer:
    def __init__(self, cfg: AjetConfig, *, workflow: Any = None, with_ray: bool = False,
                 episode_source: Any = None) -> None:
        self.cfg = cfg
        self._episode_source, self.source = episode_source, None
        self.run_dir = Path(cfg.project.exp_dir) / cfg.project.name
        self._workflow_arg = workflow
        self.with_ray = with_ray
        self.step = 0
        self._loop = asyncio.new_event_loop()
        self._closers: list[Any] = []

    # ------------------------------------------------------------------ setup
    def setup(self, *, resume: bool) -> None:
        from ajet.cli.common import UserError

        cfg = self.cfg
        if cfg.algorithm.name not in RL_ALGORITHMS:
            raise UserError(f"algorithm.name={cfg.algorithm.name.value} is not an RL algorithm; "
                            "use `ajet sft` / the staged pipeline for sft and dpo.")
        self._prepare_run_dir(resume)
        # Fail fast on user code and data before the model loads.
        self.workflow = self._load_workflow()
        self.reader = self._build_reader()
        self.judge = self._build_judge()
        self._build_model()
        self._build_rollout()
        if self.with_ray:  # episodes run in Ray actors; engine, tracker and trainer stay here
            from ajet.rollout.ray_rollout import attach

            self._closers.append(attach(self))
        from ajet.backbones.debug.update import PolicyUpdater

        self.updater = PolicyUpdater(
            self.model, cfg.trainer, cfg.algorithm,
            temperature=cfg.rollout.temperature or 1.0,
        )
        if resume:
            self._resume()
        from ajet.logging.metrics import MetricsLogger

        self.metrics = MetricsLogger(self.run_dir, cfg.logging, run_name=cfg.project.name,
                                     config_dict={"yaml": to_yaml(cfg)})
        self._closers.append(self.metrics.close)
        if self._episode_source is not None:
            self.source = self._episode_source(self)
            self._closers.append(self.source.close)

    def _prepare_run_dir(self, resume: bool) -> None:
        from ajet.backbones.debug.checkpoint import cleanup_partial, latest_checkpoint
        from ajet.cli.common import UserError

        ckpt_root = self.run_dir / "checkpoints"
        cleanup_partial(ckpt_root)
        if not resume and latest_checkpoint(ckpt_root) is not None:
            raise UserError(
                f"{self.run_dir} already holds checkpoints of an earlier run. Pass --resume to continue "
                "it, or choose another project.name / --exp-dir.",
                exit_code=2,
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))

    def _load_workflow(self) -> Any:
        from ajet.rollout.loader import as_workflow, load_workflow

        if self._workflow_arg is not None:
            return as_workflow(self._workflow_arg)
        return load_workflow(self.cfg.workflow.target)

    def _build_reader(self) -> Any:
        from ajet.task_reader import build_reader

        return build_reader(self.cfg.task_reader, seed=self.cfg.project.seed)

    def _build_judge(self) -> Any:
        from ajet.judge import build_judge

        return build_judge(self.cfg.judge, llm_client_factory=self._local_llm_client)

    def _local_llm_client(self) -> Any:
        """An OpenAI client on the gateway, for judges that default to the local model."""
        return self.stack.local_llm_client()

    def _build_model(self) -> None:
        from ajet.sft.model import load_trainable_model, model_window

        self.model, self.tokenizer = load_trainable_model(
            self.cfg.model, seed=self.cfg.project.seed,
            gradient_checkpointing=self.cfg.trainer.gradient_checkpointing,
        )
        self.model_max_len = model_window(self.model, self.cfg.context.max_model_len)

    def _build_rollout(self) -> None:
        from ajet.engine.local import LocalEngine
        from ajet.rollout.stack import RolloutStack

        self.engine = LocalEngine(self.model, self.tokenizer, max_batch_size=max(1, self.cfg.rollout.max_concurrency),
                                  max_model_len=self.model_max_len)
        self._closers.append(self.engine.close)
        self.stack = RolloutStack(self.cfg, self.engine, self.tokenizer, self.workflow,
                                  model_max_len=self.model_max_len, judge=self.judge)
        self._closers.append(self.stack.close)
        # --with-ray replaces runner and manager (ajet.rollout.ray_rollout.attach).
        self.chat, self.runner, self.manager = self.stack.chat, self.stack.runner, self.stack.manager

    def _resume(self) -> None:
        from ajet.backbones.debug.checkpoint import latest_checkpoint, load_checkpoint

        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            log.warning("--resume: no checkpoint under %s; starting from step 0", self.run_dir / "checkpoints")
            return
        state = load_checkpoint(ckpt, model=self.model, optimizer=self.updater.optimizer,
                                scheduler=self.updater.scheduler)
        self.step = int(state["step"])
        self.reader.load_state_dict(state["reader"])
        self.engine.bump_version()

    # ------------------------------------------------------------------ train
    def train(self) -> None:
        from ajet.logging.progress import TrainingProgress

        cfg = self.cfg.trainer
        progress = TrainingProgress(cfg.total_steps, self.step, quiet=self.cfg.logging.quiet)
        try:
            if self.step == 0 and cfg.val_every:
                self.validate(progress)
            while self.step < cfg.total_steps:
                metrics = self.train_step(self.step + 1, progress)
                self.step += 1
                self.metrics.log(self.step, metrics)
                if self.source is not None:
                    self.source.record_metrics(self.step, metrics)
                progress.step_done(self.step, metrics)
                if cfg.val_every and self.step % cfg.val_every == 0:
                    self.validate(progress)
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.total_steps:
                    self.save_checkpoint()
            self.save_checkpoint()
            if cfg.save_final_model:
                self.save_final_model()
        except KeyboardInterrupt:
            log.warning("interrupted: saving a checkpoint of step %d before exiting", self.step)
            if self.step > 0:
                self.save_checkpoint()
            raise
        finally:
            progress.close()

    def train_step(self, step: int, progress: Any) -> dict[str, float]:
        from ajet.backbones.samples import build_step_batch
        from ajet.context.pack import pack_samples, pack_stats

        start = time.monotonic()
        if self.source is not None:
            progress.phase(f"step {step}: waiting for {self.cfg.trainer.batch_size} groups of episodes")
            result = self._loop.run_until_complete(self.source.next_batch(step))
        else:
            tasks = self.reader.next_batch(self.cfg.trainer.batch_size)
            progress.phase(f"step {step}: rollout of {len(tasks)} tasks × {self.cfg.rollout.n}")
            result = self._loop.run_until_complete(self.manager.rollout(tasks, self.cfg.rollout.n, episode_prefix=f"s{step}-"))
        rollout_s = time.monotonic() - start
        episodes = result.ok_episodes
        metrics = dict(result.metrics())
        generated = sum(completion_tokens(ep) for ep in result.episodes)
        metrics["perf/rollout_s"] = rollout_s
        metrics["perf/tokens_per_s"] = generated / rollout_s if rollout_s > 0 else 0.0

        batch = build_step_batch(episodes, self.cfg.context, self.cfg.algorithm, model_max_len=self.model_max_len)
        metrics.update(batch.metrics)
        metrics.update(_context_metrics(result.episodes))
        has_signal = any(
            m and a != 0 for s in batch.samples for m, a in zip(s.loss_mask, s.advantages, strict=False)
        )
        if not has_signal:
            metrics["actor/skipped_update"] = 1.0
            log.info("step %d: no learning signal (no trainable tokens or all advantages 0); weights unchanged", step)
        else:
            progress.phase(f"step {step}: update on {len(batch.samples)} samples")
            max_tokens = self.cfg.trainer.micro_batch_tokens
            packed = pack_samples(batch.samples, batch.weights, max_tokens if self.cfg.context.tree_packing else 0)
            metrics.update({f"context/{k}": float(v) for k, v in pack_stats(batch.samples, packed).items()})
            update_start = time.monotonic()
            with self.engine.paused():
                metrics.update(self.updater.update(packed))
                # Inside the pause: no request can be prefilled between the update and the bump.
                self.engine.bump_version()
            update_s = time.monotonic() - update_start
            metrics["perf/update_s"] = update_s
            tokens = sum(p.num_tokens for p in packed)
            metrics["perf/train_tokens_per_s"] = tokens / update_s if update_s > 0 else 0.0
        if self.cfg.logging.token_records and batch.samples:
            self._write_records(step, batch.samples, episodes)
        metrics["perf/step_time_s"] = time.monotonic() - start
        metrics["policy_version"] = float(self.engine.policy_version)
        return metrics

    def validate(self, progress: Any) -> dict[str, float]:
        tasks = self.reader.val_tasks()
        if not tasks:
            return {}
        k = self.cfg.trainer.val_n
        progress.phase(f"validation: {len(tasks)} tasks × {k}")
        result = self._loop.run_until_complete(self.manager.rollout(tasks, k, episode_prefix=f"val{self.step}-"))
        metrics = validation_metrics(result.episodes, k)
        self.metrics.log(self.step, metrics, split="val")
        log.info("validation at step %d: %s", self.step,
                 "  ".join(f"{key} {value:.3f}" for key, value in metrics.items()))
        return metrics

    def _write_records(self, step: int, samples: list[Any], episodes: list[Any]) -> None:
        from ajet.logging.records import write_step_records

        info = {
            ep.episode_id: {"task_id": ep.task.task_id, "is_success": ep.is_success, "query": ep.task.main_query}
            for ep in episodes
        }
        cache: dict[int, str] = {}

        def decode(token: int) -> str:
            if token not in cache:
                cache[token] = self.tokenizer.decode([token])
            return cache[token]

        write_step_records(self.run_dir, step, samples, decode_token=decode, episode_info=info)

    # ------------------------------------------------------------------ outputs
    def save_checkpoint(self) -> None:
        from ajet.backbones.debug.checkpoint import save_checkpoint

        save_checkpoint(
            self.run_dir / "checkpoints", self.step, model=self.model, optimizer=self.updater.optimizer,
            scheduler=self.updater.scheduler, extra={"reader": self.reader.state_dict()},
            keep_last=self.cfg.trainer.keep_checkpoints,
        )

    def save_final_model(self) -> None:
        from ajet.sft.model import save_final_model

        save_final_model(self.model, self.tokenizer, self.run_dir / "final_model", lora=self.cfg.model.lora.enabled)

    def cleanup(self) -> None:
        for close in reversed(self._closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - keep closing the rest, but say what failed
                log.exception("error while shutting down %s", getattr(close, "__qualname__", close))
        self._loop.close()


def completion_tokens(episode: Any) -> int:
    """Tokens the engine generated for an episode (each call's completion appears in one timeline)."""
    return sum(end - start for tl in (episode.timelines or []) for start, end in tl.completion_spans)


def _context_metrics(episodes: list[Any]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for ep in episodes:
        for key, value in (ep.tracker_stats or {}).items():
            totals[f"context/{key}"] = totals.get(f"context/{key}", 0.0) + float(value)
    return totals


def validation_metrics(episodes: list[Any], k: int) -> dict[str, float]:
    """Mean reward and success over all validation episodes, and pass@k over tasks."""
    ok = [ep for ep in episodes if ep.status == "ok"]
    by_task: dict[str, list[bool]] = {}
    for ep in episodes:
        by_task.setdefault(ep.group_id, []).append(ep.status == "ok" and bool(ep.is_success))
    n = max(1, len(episodes))
    return {
        "val/reward/mean": sum(float(ep.reward) for ep in ok) / n,
        "val/success/rate": sum(1 for ep in ok if ep.is_success) / n,
        f"val/pass@{k}": sum(1 for v in by_task.values() if any(v)) / max(1, len(by_task)),
        "val/episodes": float(len(episodes)),
        "val/failed": float(len(episodes) - len(ok)),
    }
