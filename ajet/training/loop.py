"""The step loop every recipe shares: metrics, progress, LR schedule, checkpoints, final model.

A recipe builds its model, optimizer and schedule, hands them over with `attach`, then shows
its own loop:

    with loop.steps(validate=..., validate_at=...) as steps:
        for step in steps:
            metrics = ...                      # roll out, update: the recipe's step
            loop.commit(metrics)

`commit` ends the step: it advances the LR schedule once (the documented event: one training
step, see `ajet.training.optim`), logs the metrics, watches them for signs that the run is not
learning (`ajet.outputs.learning_signs`: a warning the first time each holds) and updates the
progress display. Between steps the loop validates when asked, checkpoints every
`trainer.save_every` steps and after the first step that ends `trainer.save_every_minutes` after
the last checkpoint, exports the model at `trainer.export_at_minutes` of wall time and stops
early at `trainer.max_minutes`. At the
end: a last checkpoint (unless `trainer.save_last_checkpoint` is false) and `RUN/final_model`.

A run that stops early (Ctrl-C, an error: a diverged update, every episode failing, a judge
or teacher that fails) saves the checkpoint of its last finished step first, so `--resume`
continues from it, unless an update of the next step had already begun changing the weights:
a checkpoint labelled N must hold step N's weights, never N+1's (resuming would apply that
update twice), so the newest checkpoint on disk stays the one to resume from. The recipe's
own state (`attach(state=...)`) is asked for the state as of the end of the step it saves
(the task reader's position before any later step's draw: see `TaskReader.state_at_end_of`).
Memory freed goes back to the OS (`ajet.training.memory`): large tensors as they are freed
(from the loop's start, `trainer.malloc_mmap_threshold_kb`), the rest after each step, so the
rollout that follows starts from the model and optimizer state, not from the update's peak.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from ajet.config import to_yaml
from ajet.config.schema import AjetConfig
from ajet.errors import DiskFullError
from ajet.faults import at_step, fault_point
from ajet.outputs.learning_signs import LearningSignsMonitor
from ajet.outputs.metrics import MetricsLogger, read_metrics
from ajet.outputs.progress import TrainingProgress
from ajet.outputs.records import drop_records_after
from ajet.signals import (
    StopNow,
    holding_stops,
    raise_pending_stop,
    stop_at_step_end,
    take_requested_stop,
)
from ajet.training.checkpoint import apply_lr, load_checkpoint, save_checkpoint, set_aside_corrupt
from ajet.training.checkpoint_dir import checkpoint_step, latest_checkpoint
from ajet.training.memory import limit_heap_retention, release_memory
from ajet.training.model import save_final_model
from ajet.training.recipe import Closers

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LRScheduler
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

T = TypeVar("T")


class TrainingLoop:
    def __init__(self, cfg: AjetConfig, run_dir: Path, closers: Closers, *, total_steps: int,
                 resume: bool = False) -> None:
        limit_heap_retention(cfg.trainer.malloc_mmap_threshold_kb * 1024)  # before the run allocates
        self.cfg = cfg
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.step = 0
        # A resumed run continues after its newest checkpoint: what an earlier attempt logged
        # past it (metrics, token records) is dropped so every step appears exactly once.
        # With no checkpoint yet, the run starts over: nothing of the earlier attempt is kept.
        if resume:  # a checkpoint whose files fail their checksums is set aside, with a warning
            set_aside_corrupt(run_dir / "checkpoints")
        resume_step = (self.resume_step() or -1) if resume else None
        if resume_step is not None:
            drop_records_after(run_dir, resume_step)
        self.metrics = MetricsLogger(run_dir, cfg.logging, run_name=cfg.project.name,
                                     config_dict={"yaml": to_yaml(cfg)}, resume_step=resume_step)
        closers.push(self.metrics.close, "metrics")
        # Signs that the run is not learning, warned once each; a resumed run keeps its earlier steps.
        self.signs = LearningSignsMonitor(read_metrics(self.metrics.path) if resume_step is not None else ())
        self.progress: TrainingProgress | None = None
        self._model: torch.nn.Module | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: LRScheduler | None = None
        self._state: Callable[[int], dict[str, object]] = lambda step: {}
        # Optimizer steps begun so far, and how many of them the last finished step had: more
        # means the weights are (partly) the next step's.
        self._updates_begun = 0
        self._updates_at_step_end = 0
        self._finishing = False  # the running step is being committed
        self._lr = 0.0  # the running step's learning rate (the schedule's, as the step began)
        self._out_of_time = False  # trainer.max_minutes ended the step loop
        self._saved_at = time.monotonic()  # trainer.save_every_minutes counts from here
        self._kept: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {}  # see `keep`
        self._export: Callable[[Path], None] | None = None  # see `attach`

    def attach(self, model: torch.nn.Module | None, tokenizer: PreTrainedTokenizerBase | None,
               optimizer: torch.optim.Optimizer | None, scheduler: LRScheduler,
               state: Callable[[int], dict[str, object]] | None = None,
               export: Callable[[Path], None] | None = None) -> None:
        """What the loop checkpoints; `state(step)` adds the recipe's own resumable state as of
        the end of `step`. `export(out)`: how the model is exported (RUN/final_model, exports/),
        where it is not the attached model (weights held by a service: the tinker backbone)."""
        self._export = export
        self._model, self._tokenizer = model, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        if state is not None:
            self._state = state
        if optimizer is not None:  # None: a loop that never updates (tests of the loop alone)
            # An update that does not say when it begins (`update_begins`) begins at the latest here.
            optimizer.register_step_pre_hook(lambda *_: self.update_begins())

    def keep(self, name: str, state: Callable[[], T], load: Callable[[T], None]) -> None:
        """Also checkpoint `state()` under `name`, and hand it to `load` when the run resumes
        (call before `restore`)."""

        def load_saved(saved: object) -> None:
            load(cast(T, saved))  # what `state()` returned, read back from this run's checkpoint

        self._kept[name] = (state, load_saved)

    def update_begins(self) -> None:
        """An update of the running step begins (`OptimizerStep.run` says so before its first
        forward): from here the weights count as no longer the last finished step's, so a stop
        neither abandons the step nor saves them as that step's checkpoint."""
        self._updates_begun += 1
        fault_point("update")

    @property
    def weights_are_of_last_step(self) -> bool:
        """Whether no update has begun since the last finished step (or the restore)."""
        return self._updates_begun == self._updates_at_step_end

    def resume_step(self) -> int:
        """The step of the newest complete checkpoint (0 when there is none)."""
        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        return 0 if ckpt is None else checkpoint_step(ckpt)

    def restore(self) -> dict[str, object] | None:
        """Load the newest checkpoint (weights, optimizer, schedule, RNG); its saved state, or None."""
        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            log.warning("--resume: no checkpoint under %s; starting from step 0", self.run_dir / "checkpoints")
            return None
        scheduler = _attached(self.scheduler, "scheduler")
        configured = list(scheduler.base_lrs)  # trainer.lr as this run's config says
        state = load_checkpoint(ckpt, model=_attached(self._model, "model"),
                                optimizer=_attached(self.optimizer, "optimizer"), scheduler=scheduler)
        step = state["step"]
        assert isinstance(step, int)  # load_checkpoint checked it
        self.step = step
        apply_lr(scheduler, configured, self.step)
        self._updates_at_step_end = self._updates_begun
        for name, (_, load) in self._kept.items():
            if name in state:  # a checkpoint written before `name` was kept has none
                load(state[name])
        return state

    def log(self, metrics: dict[str, float], split: str = "train") -> None:
        self.metrics.log(self.step, metrics, split=split)

    def phase(self, text: str) -> None:
        if self.progress is not None:
            self.progress.phase(text)

    @contextmanager
    def steps(self, *, validate: Callable[[], object] | None = None,
              validate_at: Callable[[int], bool] | None = None) -> Iterator[Iterator[int]]:
        """The run: `with loop.steps(...) as steps: for step in steps: ...; loop.commit(metrics)`.

        Yields the numbers of the steps to train, `self.step + 1 .. total_steps`; each must end
        with `commit`. Between steps: validation (`validate_at(step)`, default every
        `trainer.val_every` steps and before the first), checkpoints when due, exports, the
        `trainer.max_minutes` clock. After the last step: the last checkpoint and the final
        model. Anything that ends the block early (Ctrl-C, SIGTERM, an error) saves the checkpoint
        of the last committed step first (`save_on_stop`), then goes on up."""
        t = self.cfg.trainer
        if validate_at is None:
            validate_at = lambda step: bool(t.val_every) and step % t.val_every == 0  # noqa: E731
        self.progress = progress = TrainingProgress(self.total_steps, self.step, quiet=self.cfg.logging.quiet,
                                                    max_minutes=t.max_minutes)
        take_requested_stop()  # none is pending when a loop begins
        self._saved_at = time.monotonic()
        steps = self._steps(validate, validate_at)
        try:
            yield steps
            if self.step < self.total_steps and not self._out_of_time:  # the block left the loop early
                raise RuntimeError(f"the step loop ended at step {self.step} of {self.total_steps} "
                                   "without an error: a recipe's `for step in steps` must not break")
            fault_point("export")
            if t.save_last_checkpoint:
                self.save_checkpoint()
            if t.save_final_model:
                self.save_final_model()
        except BaseException as exc:  # Ctrl-C, SystemExit, any error: keep what is committed, then re-raise
            steps.close()  # the step's stop handler goes (a stop during this save stops at once)
            take_requested_stop()  # the step did not finish: the stop kept for its end is this one
            self.save_on_stop(exc)
            raise
        finally:
            progress.close()

    def _steps(self, validate: Callable[[], object] | None,
               validate_at: Callable[[int], bool]) -> Generator[int, None, None]:
        t = self.cfg.trainer
        clock = WallClock(t.max_minutes, t.export_at_minutes)
        self._out_of_time = False
        if validate is not None and self.step == 0 and validate_at(0):
            validate()  # the starting point; a resumed run validated it before its checkpoint
        while self.step < self.total_steps:
            raise_pending_stop()  # a stop whose KeyboardInterrupt was lost (ajet.signals) stops here
            # A stop before the step changes anything abandons it; once its update has begun
            # (or it is being committed) the step runs to its end, then the run stops.
            self._finishing = False
            self._lr = float(_attached(self.scheduler, "scheduler").get_last_lr()[0])
            step = self.step + 1
            at_step(step)
            with stop_at_step_end(self._step_has_begun_to_commit):
                yield step
                if self.step != step:
                    raise RuntimeError(f"step {step} ended without loop.commit(metrics)")
            if stop := take_requested_stop():
                raise KeyboardInterrupt(stop)
            fault_point("committed", step)
            if validate is not None and validate_at(self.step):
                fault_point("validation", step)
                validate()
            if self.step < self.total_steps and (
                    (t.save_every and self.step % t.save_every == 0)
                    or (t.save_every_minutes and self._minutes_since_save() >= t.save_every_minutes)):
                self.save_checkpoint()
            for mark in clock.exports_due():
                self.save_final_model(self.run_dir / "exports" / f"min_{mark:g}")
            if clock.out_of_time() and self.step < self.total_steps:
                log.info("trainer.max_minutes=%g reached after step %d of %d: ending the run",
                         t.max_minutes, self.step, self.total_steps)
                self._out_of_time = True
                return

    def _step_has_begun_to_commit(self) -> bool:
        return self._finishing or not self.weights_are_of_last_step

    def commit(self, metrics: dict[str, float]) -> None:
        """End the running step: the LR schedule advances, the step count, the metrics line, the
        display. From here a stop lets the step end (and be checkpointed) before the run stops."""
        self._finishing = True
        fault_point("updated", self.step + 1)
        release_memory()
        with warnings.catch_warnings():
            # The schedule advances once per training step by design (ajet.training.optim),
            # also after a step without a learning signal, which skips optimizer.step().
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            _attached(self.scheduler, "scheduler").step()
        metrics["actor/lr"] = self._lr
        self.step += 1
        self._updates_at_step_end = self._updates_begun
        self.log(metrics)
        self.signs.observe(self.step, metrics)
        if self.progress is not None:
            self.progress.step_done(self.step, metrics, signs=self.signs.active)

    def save_on_stop(self, exc: BaseException) -> None:
        """The checkpoint of the last finished step, if it is whole and not yet on disk."""
        ckpt_root = self.run_dir / "checkpoints"
        newest = latest_checkpoint(ckpt_root)
        on_disk = f"the newest checkpoint is {newest}" if newest else "no checkpoint was saved"
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopping on {type(exc).__name__}"
        if self.step == 0 or (newest is not None and checkpoint_step(newest) == self.step):
            log.warning("%s at step %d: %s", why, self.step, on_disk)
            return
        if not self.weights_are_of_last_step:
            log.warning("%s while step %d's update was changing the weights: step %d's checkpoint "
                        "cannot be saved from them; %s (--resume continues from it)",
                        why, self.step + 1, self.step, on_disk)
            return
        if isinstance(exc, DiskFullError):  # writing another one would fail the same way
            log.warning("%s: %s", why, on_disk)
            return
        if isinstance(exc, StopNow):  # a second stop: an update may still be running
            log.warning("stopped at once by a second signal: nothing more is saved; %s", on_disk)
            return
        log.warning("%s: saving the checkpoint of step %d (the last finished step) before exiting", why, self.step)
        try:
            self._write_checkpoint()  # the run is ending already: a stop during the write adds nothing
        except (OSError, RuntimeError) as save_error:  # the original error is the one to report
            log.error("could not save the checkpoint of step %d (%s); %s", self.step, save_error, on_disk)

    def _minutes_since_save(self) -> float:
        return (time.monotonic() - self._saved_at) / 60

    def save_checkpoint(self) -> None:
        """Write the checkpoint of the last finished step. A stop that arrives meanwhile waits for
        the write (an interrupted `torch.save` fails the write), then stops the run."""
        self._write_checkpoint()
        raise_pending_stop()

    def _write_checkpoint(self) -> None:
        self._saved_at = time.monotonic()
        with holding_stops(f"writing the checkpoint of step {self.step}"):
            save_checkpoint(self.run_dir / "checkpoints", self.step, model=_attached(self._model, "model"),
                            optimizer=_attached(self.optimizer, "optimizer"),
                            scheduler=_attached(self.scheduler, "scheduler"),
                            extra={**self._state(self.step), **{n: state() for n, (state, _) in self._kept.items()}},
                            keep_last=self.cfg.trainer.keep_checkpoints)

    def save_final_model(self, out: Path | None = None) -> None:
        """Export the model (RUN/final_model, or `out`); a stop meanwhile waits for the export."""
        lora = self.cfg.model.lora
        with holding_stops("exporting the model"):
            if self._export is not None:
                self._export(out or self.run_dir / "final_model")
            else:
                save_final_model(_attached(self._model, "model"), self._tokenizer,
                                 out or self.run_dir / "final_model", lora=lora.enabled,
                                 per_role=lora.enabled and lora.per_role, export_merged=lora.export_merged)
        raise_pending_stop()


class WallClock:
    """Minutes since the step loop began, against `trainer.max_minutes` and
    `trainer.export_at_minutes` (each mark is due once, after the first step that ends past it)."""

    def __init__(self, max_minutes: float, export_at: list[float], now: Callable[[], float] | None = None) -> None:
        self.max_minutes = max_minutes
        self.pending = sorted(set(export_at))
        self.now = now or time.monotonic
        self.start = self.now()

    def minutes(self) -> float:
        return (self.now() - self.start) / 60

    def exports_due(self) -> list[float]:
        """The export marks passed since the last call (each once)."""
        elapsed = self.minutes()
        due = [m for m in self.pending if m <= elapsed]
        self.pending = [m for m in self.pending if m > elapsed]
        return due

    def out_of_time(self) -> bool:
        return bool(self.max_minutes) and self.minutes() >= self.max_minutes


def _attached(value: T | None, what: str) -> T:
    """What `attach` handed over; a clear error when it was not."""
    if value is None:
        raise RuntimeError(f"the training loop has no {what}: call loop.attach(model, tokenizer, optimizer, "
                           "scheduler) first")
    return value
