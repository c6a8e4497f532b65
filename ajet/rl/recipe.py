"""The RL recipe (GRPO family), in one process: setup -> train -> cleanup. The debug backbone runs it.

One step: read tasks -> run episodes (the engine batches every episode's calls) -> merge and
pack samples -> advantages -> update the shared weights -> bump the policy version. The engine
and the trainer share one model object, so a weight sync is a version bump. What every recipe
shares (run dir, checkpoints, optimizer and schedule, the model, validation, progress) is in
`ajet.training`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ajet.algorithms.distill import distill_advantages
from ajet.algorithms.registry import get_algorithm, names
from ajet.config.schema import AjetConfig
from ajet.context.pack import pack_samples, pack_stats
from ajet.context.types import Sample
from ajet.engine.sampling import policy_temperature
from ajet.errors import ConfigError, UserError
from ajet.faults import fault_point
from ajet.outputs.records import write_step_records
from ajet.own_thread import in_own_thread
from ajet.rl.samples import StepBatch, build_step_batch
from ajet.rl.update import PolicyUpdater
from ajet.rollout.episode import Episode
from ajet.rollout.failed_steps import FailedSteps
from ajet.rollout.manager import RolloutManager, RolloutResult
from ajet.rollout.overlap import OverlappedEpisodes
from ajet.rollout.ray_rollout import build_ray_manager, workflow_spec
from ajet.rollout.source import EpisodeSource, managed_episodes
from ajet.rollout.workflow_loader import WorkflowArg, trainable_targets_of
from ajet.signals import defer_stop
from ajet.task_reader.selection import Outcome
from ajet.training.recipe import Closers, run_recipe
from ajet.training.rollout_run import RolloutRun
from ajet.training.step import overlapped_update, updating_weights
from ajet.training.teacher import Teacher, build_teacher
from ajet.training.validation import validate_on_rollout
from ajet.workflow import WorkflowTask

log = logging.getLogger(__name__)

# Builds the episode source from the set-up recipe (engine, reader and judge exist then).
SourceFactory = Callable[["RLRecipe"], EpisodeSource]


def train(cfg: AjetConfig, *, with_ray: bool = False, resume: bool = False, workflow: WorkflowArg | None = None,
          episode_source: SourceFactory | None = None) -> Path:
    """Train on the debug backbone; return the run directory. `episode_source(recipe)` (`ajet
    serve`) builds where each step's episodes come from instead of the reader and the rollout
    manager; it is called at the end of setup."""
    return run_recipe(RLRecipe(cfg, workflow=workflow, with_ray=with_ray, resume=resume,
                               episode_source=episode_source))


class RLRecipe:
    def __init__(self, cfg: AjetConfig, *, workflow: WorkflowArg | None = None, with_ray: bool = False,
                 resume: bool = False, episode_source: SourceFactory | None = None) -> None:
        self.cfg = cfg
        self.workflow_arg = workflow
        self.with_ray = with_ray
        self.resume = resume
        self.episode_source = episode_source
        self._batch_arrived: float | None = None  # when the previous step's episodes arrived
        self._decoded_then = 0  # the engine's decoded tokens when that window began

    # ------------------------------------------------------------------ setup
    def setup(self, closers: Closers) -> None:
        cfg = self.cfg
        self.algorithm = get_algorithm(cfg.algorithm.name)
        if self.algorithm.recipe != "rl":
            raise UserError(f"algorithm.name={cfg.algorithm.name} is not an RL algorithm (those are "
                            f"{', '.join(names(recipe='rl'))}); use `ajet sft` / the staged pipeline for sft and dpo.")
        run = RolloutRun.start(cfg, closers, resume=self.resume, workflow=self.workflow_arg)
        self.run_dir, self.workflow, self.reader, self.judge = run.run_dir, run.workflow, run.reader, run.judge
        self.training_loop, self.model, self.tokenizer, self.window = run.training_loop, run.model, run.tokenizer, run.window
        self.rollout = run.rollout
        self.manager = self._ray_manager(closers) if self.with_ray else self.rollout.manager
        # Built before the first update (and before a resumed run's weights load): the KL reference.
        self.updater = PolicyUpdater(self.model, run.optimizer, cfg.trainer, cfg.algorithm,
                                     temperature=policy_temperature(cfg.rollout.temperature),
                                     per_role_adapters=self.per_role)
        self.updater.optimizer_step.keep_in(self.training_loop)
        if self.resume:
            run.restore()
        # On-policy distillation: built last, after the optimizer (an adapter teacher is never in it).
        self.teacher: Teacher | None = None
        if self.algorithm.teacher:
            self.teacher = build_teacher(cfg, self.model, self.tokenizer,
                                         temperature=policy_temperature(cfg.rollout.temperature))
            closers.push(self.teacher.close, "distillation teacher")
        if self.episode_source is not None:
            self.source = self.episode_source(self)
        else:
            self.source = managed_episodes(self.manager, self.reader, cfg.rollout, batch_size=cfg.trainer.batch_size,
                                           phase=self.training_loop.phase)
            if cfg.rollout.max_staleness > 0:
                self.source = self._overlapped(self.source)
        closers.push(self.source.close, "episode source")

    def _overlapped(self, source: EpisodeSource) -> OverlappedEpisodes:
        """`rollout.max_staleness`: the next step rolls out during the update (ajet/rollout/overlap.py)."""
        engine = self.rollout.engine
        if not engine.decodes_a_copy:
            raise ConfigError("rollout.max_staleness > 0 needs the engine to decode with its own copy of the "
                              "weights while the trainer updates them: set rollout.engine_dtype=float16 or bfloat16 "
                              f"(engine_dtype={self.cfg.rollout.engine_dtype.value} decodes with {engine.dtype} here)")
        log.info("rollout overlaps the update: up to %d policy version(s) of staleness, TIS cap %g",
                 self.cfg.rollout.max_staleness, self.cfg.algorithm.tis_cap)
        return OverlappedEpisodes(source, max_staleness=self.cfg.rollout.max_staleness,
                             version=lambda: engine.policy_version)

    def _ray_manager(self, closers: Closers) -> RolloutManager:
        """Episodes run in Ray actors; the engine, tracker and trainer stay in this process."""
        cfg = self.cfg
        spec = workflow_spec(self.workflow, None if self.workflow_arg is not None else cfg.workflow.target)
        targets = trainable_targets_of(cfg.workflow.trainable_targets, self.workflow)
        manager, close = build_ray_manager(cfg.ray, cfg.rollout, spec, trainable_targets=targets,
                                           judge=self.judge, sessions=self.rollout)
        closers.push(close, "ray workers")
        return manager

    # ------------------------------------------------------------------ train
    def train(self) -> Path:
        """The RL loop. One step: draw the tasks and roll them out -> samples and advantages ->
        (teacher scores, for distillation) -> pack -> loss -> optimizer step -> commit."""
        cfg = self.cfg
        # Stops the run after `rollout.max_failed_steps` steps in which every episode failed.
        failed = FailedSteps(cfg.rollout.max_failed_steps)
        with self.training_loop.steps(validate=self.validate) as steps:
            for step in steps:
                start = time.monotonic()
                result, metrics = self.roll_out(step)  # the reader's next batch, rollout.n episodes each
                metrics.update(self.reader.observe(outcomes(result.ok_episodes)))  # task_reader.selection
                fault_point("rollout", step)
                # Merged samples of the episodes that ended, each token's advantage (GRPO family).
                batch = build_step_batch(result.ok_episodes, cfg.context, cfg.algorithm, model_max_len=self.window)
                metrics.update(batch.metrics)
                if self.teacher is not None and batch.samples:
                    metrics.update(self.distill(batch.samples))
                if not has_learning_signal(batch.samples):
                    metrics["actor/skipped_update"] = 1.0
                    log.info("step %d: no learning signal (no trainable tokens or all advantages 0); "
                             "weights unchanged", step)
                else:
                    self.training_loop.phase(f"step {step}: update on {len(batch.samples)} samples")
                    metrics.update(self._update_step(batch, step))  # pack -> loss -> optimizer.step()
                if cfg.logging.token_records and batch.samples:
                    self._write_records(step, batch.samples, result.ok_episodes)
                metrics["perf/step_time_s"] = time.monotonic() - start
                metrics["policy_version"] = float(self.rollout.engine.policy_version)
                self.source.record_metrics(step, metrics)
                self.training_loop.commit(metrics)
                failed.observe(step, result.episodes)
        return self.run_dir

    def roll_out(self, step: int) -> tuple[RolloutResult, dict[str, float]]:
        """Step `step`'s episodes (from the episode source) and the rollout's metrics."""
        cfg = self.cfg
        start = time.monotonic()
        engine = self.rollout.engine
        previous = self._batch_arrived if self.source.overlaps_update else None  # None: the window starts now
        if previous is None:
            self._decoded_then = engine.decoded_tokens()
        self.training_loop.phase(f"step {step}: waiting for {cfg.trainer.batch_size} groups of episodes")
        result = self.rollout.event_loop.run_until_complete(self.source.next_batch(step))
        arrived = time.monotonic()
        rollout_s = arrived - start
        # A source that rolls out during the update (ajet serve, rollout.max_staleness) decoded
        # since the previous batch arrived, not only while the step waited for this one: tok/s is
        # what the engine decoded in that window (every model it serves, dropped groups and
        # validation included), over it.
        generation_s = arrived - previous if previous is not None else rollout_s
        decoded = engine.decoded_tokens()
        window_tokens, self._decoded_then = decoded - self._decoded_then, decoded
        self._batch_arrived = arrived
        metrics = dict(result.metrics())
        metrics["perf/rollout_s"] = rollout_s
        metrics["perf/generation_s"] = generation_s
        metrics.update(engine.take_metrics())  # prefix cache: prompt vs prefilled tokens
        metrics["perf/tokens_per_s"] = window_tokens / max(generation_s, 1e-9)
        metrics.update(context_metrics(result.episodes))
        return result, metrics

    def distill(self, samples: list[Sample]) -> dict[str, float]:
        """The teacher scores the step's samples (engine paused: an adapter teacher forwards the
        engine's module); their advantages become teacher - student (+ reward_coef x reward's)."""
        assert self.teacher is not None
        self.training_loop.phase(f"teacher scores {len(samples)} samples")
        start = time.monotonic()
        with self.rollout.engine.paused():
            teacher_logprobs = in_own_thread(self.teacher.score, samples)  # see ajet/own_thread.py
        seconds = time.monotonic() - start
        metrics = distill_advantages(samples, teacher_logprobs, self.cfg.distill.reward_coef)
        metrics["distill/teacher_s"] = seconds
        metrics["distill/teacher_tokens_per_s"] = sum(len(s.input_ids) for s in samples) / max(seconds, 1e-9)
        return metrics

    @property
    def per_role(self) -> bool:
        """One LoRA adapter per trainable role: samples are packed and trained per role."""
        return self.cfg.model.lora.enabled and self.cfg.model.lora.per_role

    def _update_step(self, batch: StepBatch, step: int) -> dict[str, float]:
        """The step's update; with the overlap (`OverlappedEpisodes`) and a step after this one, the
        next step's rollout starts first and runs on the event loop while the update runs in a
        worker thread on the trainer's weights (the engine decodes its own copy meanwhile)."""
        if not isinstance(self.source, OverlappedEpisodes) or step >= self.cfg.trainer.total_steps:
            return self.update(batch, step=step)
        source = self.source
        # A stop (Ctrl-C) reaches this thread while the update runs in the worker: it waits for
        # an update that has begun (a checkpoint must never copy half-updated weights), and one
        # that has not begun never will.
        gate, finished = threading.Lock(), threading.Event()
        began, stopping, done = [False], [False], []

        def update() -> dict[str, float]:
            with gate:
                if stopping[0]:
                    return {}
                began[0] = True
            try:
                done.append(self.update(batch, step=step, overlap=True))
                return done[0]
            finally:
                finished.set()

        async def update_while_rolling_out() -> dict[str, float]:
            source.prefetch(step + 1)
            return await asyncio.get_running_loop().run_in_executor(None, update)

        try:
            return self.rollout.event_loop.run_until_complete(update_while_rolling_out())
        except KeyboardInterrupt as stop:
            with gate:
                stopping[0] = True
            if began[0]:
                log.warning("stopping: letting step %d's update finish first (the weights stay whole)", step)
                finished.wait()
            if done and defer_stop(str(stop) or "SIGINT"):  # updated: the step finishes, then the run stops
                return done[0]
            raise

    def update(self, batch: StepBatch, *, step: int | None = None, overlap: bool = False) -> dict[str, float]:
        """Pack (per role, with per-role adapters), one optimizer step, bump the policy version
        (`updating_weights`; with `overlap`, the engine keeps decoding its copy and the new weights
        are published at the end: `overlapped_update`)."""
        max_tokens = self.cfg.trainer.micro_batch_tokens if self.cfg.context.tree_packing else 0
        packed = pack_samples(batch.samples, batch.weights, max_tokens, by_role=self.per_role)
        metrics = {f"context/{k}": float(v) for k, v in pack_stats(batch.samples, packed).items()}
        start = time.monotonic()
        engine = self.rollout.engine
        with overlapped_update(engine) if overlap else updating_weights(engine):
            # In a thread of its own, whose OpenMP pool ends with it: decoding stays at full speed.
            metrics.update(in_own_thread(self.updater.update, packed, step=step))
        update_s = time.monotonic() - start
        metrics["perf/update_s"] = update_s
        metrics["perf/train_tokens_per_s"] = sum(p.num_tokens for p in packed) / max(update_s, 1e-9)
        return metrics

    def validate(self) -> dict[str, float]:
        metrics = validate_on_rollout(self.training_loop, self.reader, self._rollout, self.cfg.trainer.val_n)
        self.rollout.engine.take_metrics()  # validation's prefills do not count towards the next step
        return metrics

    def _rollout(self, tasks: list[WorkflowTask], n: int, *, episode_prefix: str) -> RolloutResult:
        """One rollout on the manager (in-process, or Ray workers with --with-ray)."""
        return self.rollout.event_loop.run_until_complete(self.manager.rollout(tasks, n, episode_prefix=episode_prefix))

    def _write_records(self, step: int, samples: list[Sample], episodes: list[Episode]) -> None:
        info = {
            ep.episode_id: {"task_id": ep.task.task_id, "is_success": ep.is_success, "query": ep.task.main_query}
            for ep in episodes
        }
        cache: dict[int, str] = {}

        def decode(token: int) -> str:
            if token not in cache:
                cache[token] = str(self.tokenizer.decode([token]))
            return cache[token]

        write_step_records(self.run_dir, step, samples, decode_token=decode, episode_info=info)


def outcomes(episodes: list[Episode]) -> list[Outcome]:
    """The step's episodes as the reader's task selection sees them: passed when a success."""
    return [Outcome(ep.task.task_id, ep.is_success) for ep in episodes]


def has_learning_signal(samples: list[Sample]) -> bool:
    """Whether any trained token has a non-zero advantage (else the update would do nothing)."""
    return any(m and a != 0 for s in samples for m, a in zip(s.loss_mask, s.advantage, strict=False))


def context_metrics(episodes: list[Episode]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for ep in episodes:
        for key, value in (ep.tracker_stats or {}).items():
            totals[f"context/{key}"] = totals.get(f"context/{key}", 0.0) + float(value)
    return totals
