"""The RL recipe of the debug backbone (GRPO family), in one process: setup -> train -> cleanup.

One step: read tasks -> run episodes (the engine batches every episode's calls) -> merge and
pack samples -> advantages -> update the shared weights -> bump the policy version. The engine
and the trainer share one model object, so a weight sync is a version bump. What every recipe
shares (run dir, checkpoints, optimizer and schedule, the model, validation, progress) is in
`ajet.training`.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

from ajet.config.schema import RL_ALGORITHMS, AjetConfig
from ajet.errors import UserError
from ajet.training.recipe import Closers, run_recipe

log = logging.getLogger(__name__)


def train(cfg: AjetConfig, *, with_ray: bool = False, resume: bool = False, workflow: Any = None,
          episode_source: Any = None) -> Path:
    """Train on the debug backbone; return the run directory. `episode_source(recipe)` (`ajet
    serve`) builds what gives each step's episodes (`next_batch(step)`) instead of the rollout
    manager; it is called at the end of setup, when the engine, reader and judge exist."""
    return run_recipe(RLRecipe(cfg, workflow=workflow, with_ray=with_ray, resume=resume,
                               episode_source=episode_source))


class RLRecipe:
    def __init__(self, cfg: AjetConfig, *, workflow: Any = None, with_ray: bool = False,
                 resume: bool = False, episode_source: Any = None) -> None:
        self.cfg = cfg
        self.workflow_arg = workflow
        self.with_ray = with_ray
        self.resume = resume
        self.episode_source, self.source = episode_source, None

    # ------------------------------------------------------------------ setup
    def setup(self, closers: Closers) -> None:
        from ajet.backbones.debug.update import PolicyUpdater
        from ajet.engine.sampling import policy_temperature
        from ajet.judge import build_judge
        from ajet.rollout.loader import load_or_wrap_workflow
        from ajet.rollout.local import LocalRollout
        from ajet.task_reader import build_reader
        from ajet.training.loop import TrainingLoop
        from ajet.training.model import load_trainable_model, model_window
        from ajet.training.optim import build_optimizer
        from ajet.training.run_dir import prepare_run_dir

        cfg = self.cfg
        if cfg.algorithm.name not in RL_ALGORITHMS:
            raise UserError(f"algorithm.name={cfg.algorithm.name.value} is not an RL algorithm; "
                            "use `ajet sft` / the staged pipeline for sft and dpo.")
        self.run_dir = prepare_run_dir(cfg, resume=self.resume)
        # Fail fast on user code and data before the model loads.
        self.workflow = load_or_wrap_workflow(self.workflow_arg, cfg.workflow.target)
        self.reader = build_reader(cfg.task_reader, seed=cfg.project.seed)
        self.judge = build_judge(cfg.judge, llm_client_factory=lambda: self.rollout.stack.local_llm_client())
        self.loop = TrainingLoop(cfg, self.run_dir, closers, total_steps=cfg.trainer.total_steps,
                                 resume=self.resume)
        self.model, self.tokenizer = load_trainable_model(
            cfg.model, seed=cfg.project.seed, gradient_checkpointing=cfg.trainer.gradient_checkpointing)
        self.window = model_window(self.model, cfg.context.max_model_len)
        self.rollout = LocalRollout(cfg, self.model, self.tokenizer, self.workflow, model_max_len=self.window,
                                    judge=self.judge)
        closers.push(self.rollout.close, "rollout")
        self.manager = self.rollout.manager
        if self.with_ray:  # episodes run in Ray actors; engine, tracker and trainer stay here
            self.manager = self._ray_manager(closers)
        optimizer, scheduler = build_optimizer(self.model, cfg.trainer, seed=cfg.project.seed)
        self.updater = PolicyUpdater(self.model, optimizer, cfg.trainer, cfg.algorithm,
                                     temperature=policy_temperature(cfg.rollout.temperature))
        self.loop.attach(self.model, self.tokenizer, optimizer, scheduler,
                         state=lambda: {"reader": self.reader.state_dict()})
        if self.resume and (state := self.loop.restore()) is not None:
            self.reader.load_state_dict(state["reader"])
            self.rollout.engine.bump_version()
        if self.episode_source is not None:
            self.source = self.episode_source(self)
            closers.push(self.source.close, "episode source")

    def _ray_manager(self, closers: Closers) -> Any:
        from ajet.rollout.ray_rollout import build_ray_manager, workflow_spec

        cfg = self.cfg
        spec = workflow_spec(self.workflow, None if self.workflow_arg is not None else cfg.workflow.target)
        targets = list(cfg.workflow.trainable_targets) or list(getattr(self.workflow, "trainable_targets", None) or [])
        manager, close = build_ray_manager(cfg.ray, cfg.rollout, spec, trainable_targets=targets or None,
                                           judge=self.judge, sessions=self.rollout.factory)
        closers.push(close, "ray workers")
        return manager

    # ------------------------------------------------------------------ train
    def train(self) -> Path:
        from ajet.rollout.failed_steps import FailedSteps

        # Stops the run after `rollout.max_failed_steps` steps in which every episode failed.
        failed = FailedSteps(self.cfg.rollout.max_failed_steps)
        self.loop.run(self.train_step, validate=self.validate,
                      after_step=lambda step: failed.observe(step, self._last_episodes))
        return self.run_dir

    def train_step(self, step: int) -> dict[str, float]:
        from ajet.backbones.samples import build_step_batch

        cfg = self.cfg
        start = time.monotonic()
        dynamic: dict[str, float] = {}
        if self.source is not None:
            self.loop.phase(f"step {step}: waiting for {cfg.trainer.batch_size} groups of episodes")
            result = self.rollout.loop.run_until_complete(self.source.next_batch(step))
        elif cfg.rollout.dynamic_sampling.enabled:
            result, dynamic = self._rollout_with_signal(step)
        else:
            tasks = self.reader.next_batch(cfg.trainer.batch_size, step=step)
            self.loop.phase(f"step {step}: rollout of {len(tasks)} tasks × {cfg.rollout.n}")
            result = self._rollout(tasks, cfg.rollout.n, episode_prefix=f"s{step}-")
        rollout_s = time.monotonic() - start
        self._last_episodes = list(result.episodes)
        metrics = dict(result.metrics())
        metrics.update(dynamic)
        if self.source is None and self.reader.curriculum is not None:
            metrics["data/curriculum_pool"] = self.reader.curriculum.pool_fraction(step)
        metrics["perf/rollout_s"] = rollout_s
        metrics.update(self.rollout.engine.take_metrics())  # prefix cache: prompt vs prefilled tokens
        metrics["perf/tokens_per_s"] = sum(completion_tokens(ep) for ep in result.episodes) / max(rollout_s, 1e-9)
        metrics.update(context_metrics(result.episodes))

        batch = build_step_batch(result.ok_episodes, cfg.context, cfg.algorithm, model_max_len=self.window)
        metrics.update(batch.metrics)
        if not has_learning_signal(batch.samples):
            metrics["actor/skipped_update"] = 1.0
            log.info("step %d: no learning signal (no trainable tokens or all advantages 0); weights unchanged", step)
        else:
            self.loop.phase(f"step {step}: update on {len(batch.samples)} samples")
            metrics.update(self.update(batch))
        if cfg.logging.token_records and batch.samples:
            self._write_records(step, batch.samples, result.ok_episodes)
        metrics["perf/step_time_s"] = time.monotonic() - start
        metrics["policy_version"] = float(self.rollout.engine.policy_version)
        if self.source is not None:
            self.source.record_metrics(step, metrics)
        return metrics

    def update(self, batch: Any) -> dict[str, float]:
        """Pack, one optimizer step, bump the policy version (inside the engine pause: no request
        is prefilled between the update and the bump)."""
        from ajet.context.pack import pack_samples, pack_stats

        max_tokens = self.cfg.trainer.micro_batch_tokens if self.cfg.context.tree_packing else 0
        packed = pack_samples(batch.samples, batch.weights, max_tokens)
        metrics = {f"context/{k}": float(v) for k, v in pack_stats(batch.samples, packed).items()}
        start = time.monotonic()
        from ajet.training.memory import release_memory

        with self.rollout.engine.paused():
            self.rollout.engine.drop_prefix_cache()  # invalid after the update: free it for the update
            # What the rollout freed in small blocks (below trainer.malloc_mmap_threshold_kb) sits in
            # the engine thread's malloc arena, where the update cannot reuse it: give it back first.
            release_memory()
            metrics.update(self.updater.update(packed))
            self.rollout.engine.bump_version()
        update_s = time.monotonic() - start
        metrics["perf/update_s"] = update_s
        metrics["perf/train_tokens_per_s"] = sum(p.num_tokens for p in packed) / max(update_s, 1e-9)
        return metrics

    def validate(self) -> dict[str, float]:
        from ajet.training.validation import validate_on_rollout

        metrics = validate_on_rollout(self.loop, self.reader, self._rollout, self.cfg.trainer.val_n)
        self.rollout.engine.take_metrics()  # validation's prefills do not count towards the next step
        return metrics

    def _rollout_with_signal(self, step: int) -> tuple[Any, dict[str, float]]:
        """Dynamic sampling: groups whose rewards are all equal are dropped and refilled with
        more tasks, up to `rollout.dynamic_sampling.max_rounds` rounds (`ajet.rollout.dynamic`)."""
        from ajet.rollout.dynamic import sample_with_signal

        cfg = self.cfg

        async def one_round(tasks: list[Any], index: int) -> Any:
            self.loop.phase(f"step {step}: rollout round {index + 1} of {len(tasks)} tasks × {cfg.rollout.n}")
            prefix = f"s{step}-" if index == 0 else f"s{step}r{index}-"
            return await self.manager.rollout(tasks, cfg.rollout.n, episode_prefix=prefix)

        return self.rollout.loop.run_until_complete(sample_with_signal(
            one_round, functools.partial(self.reader.next_batch, step=step), batch_size=cfg.trainer.batch_size,
            max_rounds=cfg.rollout.dynamic_sampling.max_rounds))

    def _rollout(self, tasks: list[Any], n: int, *, episode_prefix: str) -> Any:
        """One rollout on the manager (in-process, or Ray workers with --with-ray)."""
        return self.rollout.loop.run_until_complete(self.manager.rollout(tasks, n, episode_prefix=episode_prefix))

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


def has_learning_signal(samples: list[Any]) -> bool:
    """Whether any trained token has a non-zero advantage (else the update would do nothing)."""
    return any(m and a != 0 for s in samples for m, a in zip(s.loss_mask, s.advantage, strict=False))


def completion_tokens(episode: Any) -> int:
    """Tokens the engine generated for an episode (each call's completion appears in one timeline)."""
    return sum(end - start for tl in (episode.timelines or []) for start, end in tl.completion_spans)


def context_metrics(episodes: list[Any]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for ep in episodes:
        for key, value in (ep.tracker_stats or {}).items():
            totals[f"context/{key}"] = totals.get(f"context/{key}", 0.0) + float(value)
    return totals
