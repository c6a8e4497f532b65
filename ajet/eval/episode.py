"""`ajet episode`: run one episode (or k) of a config's workflow on one task, in this process,
and show what training would see: the calls, their tokens and which are trained, the merged
samples, the reward, and where the time went.

It is the inner loop after a change to a workflow: no training, no evaluation of a split, no
validation. Everything runs in the calling process and thread (the workflow on this process's
event loop, a plain `def` workflow in a worker thread), so a `breakpoint()` in the workflow
stops there; `post_mortem` (the CLI's `--pdb`) opens the debugger at a workflow's exception.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ajet.config.schema import AjetConfig, EvalSplit
from ajet.context.samples import episode_samples
from ajet.context.types import LLMCall, Sample
from ajet.errors import EvalError
from ajet.eval.runner import split_tasks
from ajet.rollout.episode import Episode
from ajet.task_reader import build_reader
from ajet.workflow import WorkflowTask

log = logging.getLogger(__name__)

# With --pdb the episode may sit in the debugger for as long as the user likes.
DEBUGGER_TIMEOUT_S = 24 * 3600.0


@dataclass
class EpisodeView:
    """One episode as training would see it."""

    episode: Episode
    calls: list[LLMCall]
    samples: list[Sample]
    decode: Callable[[list[int]], str]


@dataclass
class Shown:
    """What `show_episodes` ran: the task, its episodes, and the seconds each part took."""

    task: WorkflowTask
    index: int  # the task's position in its split
    split: str
    views: list[EpisodeView]
    timings: dict[str, float] = field(default_factory=dict)
    engine_dtype: str = ""  # what the engine decoded with


def pick_task(tasks: list[WorkflowTask], ref: str, split: str) -> tuple[int, WorkflowTask]:
    """The task `ref` names: its index in the split, or its task id."""
    if ref.lstrip("-").isdigit():
        index = int(ref)
        if not -len(tasks) <= index < len(tasks):
            raise EvalError(f"--task {ref}: the {split} split has {len(tasks)} tasks (0..{len(tasks) - 1}); "
                            "give an index in that range or a task id")
        return index % len(tasks), tasks[index]
    for index, task in enumerate(tasks):
        if task.task_id == ref:
            return index, task
    some = ", ".join(t.task_id for t in tasks[:5])
    raise EvalError(f"--task {ref}: no task of the {split} split has that id (its first ids: {some}); "
                    "give a task id or an index")


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.monotonic() - start


def show_episodes(cfg: AjetConfig, *, task: str = "0", n: int = 1, split: EvalSplit = EvalSplit.train,
                  on_workflow_error: Callable[[BaseException], None] | None = None,
                  timings: dict[str, float] | None = None) -> Shown:
    """Run `n` episodes of the task `task` (an index or an id) of `split` with `model.path`.

    `on_workflow_error` is called with a workflow's exception where it is caught, before the
    episode is recorded as failed (`--pdb`: the debugger, with the workflow's frames alive).
    `timings` collects the seconds of each part (the CLI adds its own start-up)."""
    timings = {} if timings is None else timings
    with _timed(timings, "tasks"):
        tasks = split_tasks(build_reader(cfg.task_reader, seed=cfg.project.seed), split)
        index, chosen = pick_task(tasks, task, split.value)
    with _timed(timings, "workflow import"):
        from ajet.rollout.workflow_loader import load_workflow

        workflow = load_workflow(cfg.workflow.target)
    with _timed(timings, "model load"):
        from ajet.models.load import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(cfg.model)
    with _timed(timings, "engine start"):
        from ajet.rollout.engine_rollout import EngineRollout
        from ajet.training.model import model_window

        window = model_window(model, cfg.context.max_model_len)
        rollout = EngineRollout.local(cfg, model, tokenizer, workflow, model_max_len=window, record=True,
                                    fixed_weights=True)
    dtype = rollout.engine.dtype
    try:
        with _timed(timings, "episodes"), _workflow_errors(on_workflow_error):
            result = rollout.rollout([chosen], n, episode_prefix="try-")
        views = []
        for ep in sorted(result.episodes, key=lambda e: e.episode_id):
            samples = episode_samples(ep, cfg.context, window)[0] if ep.ok else []
            views.append(EpisodeView(ep, rollout.calls(ep.episode_id), samples,
                                     lambda ids: tokenizer.decode(ids, skip_special_tokens=False)))
    finally:
        rollout.close()
    return Shown(task=chosen, index=index, split=split.value, views=views, timings=timings,
                 engine_dtype=dtype)


@contextmanager
def _workflow_errors(hook: Callable[[BaseException], None] | None) -> Iterator[None]:
    """Call `hook` with each workflow exception where the runner catches it."""
    from ajet.rollout.runner import ON_WORKFLOW_ERROR

    token = ON_WORKFLOW_ERROR.set(hook)
    try:
        yield
    finally:
        ON_WORKFLOW_ERROR.reset(token)


def for_debugger(cfg: AjetConfig) -> AjetConfig:
    """`cfg` for a session in the debugger: no episode timeout (a breakpoint would hit it)."""
    cfg.rollout = dataclasses.replace(cfg.rollout, episode_timeout_s=DEBUGGER_TIMEOUT_S)
    return cfg
