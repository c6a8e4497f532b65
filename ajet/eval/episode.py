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
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ajet.config.schema import AjetConfig, EvalSplit
from ajet.context.samples import episode_samples
from ajet.context.types import LLMCall, Sample
from ajet.errors import EvalError
from ajet.models.load import load_model_and_tokenizer
from ajet.rollout.episode import Episode
from ajet.rollout.runner import ON_WORKFLOW_ERROR
from ajet.rollout.workflow_loader import load_workflow
from ajet.task_reader import build_reader, split_tasks
from ajet.training.model import model_window
from ajet.workflow import Workflow, WorkflowTask

if TYPE_CHECKING:
    from ajet.engine.local import LocalEngine
    from ajet.rollout.engine_rollout import EngineRollout

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
    with Tryout.open(cfg, split=split, check_task=task, timings=timings) as tryout:
        return tryout.show(task, n, on_workflow_error=on_workflow_error, timings=timings)


class Tryout:
    """What `ajet episode` runs episodes on: the split's tasks, the model, its engine and a
    rollout of the workflow. `Tryout.open` builds it once; `show` runs and shows episodes;
    `reload` imports the workflow again and keeps the rest (`ajet episode --watch`)."""

    def __init__(self, cfg: AjetConfig, split: EvalSplit, tasks: list[WorkflowTask], tokenizer: Any,
                 window: int, engine: LocalEngine, workflow: Workflow) -> None:
        self.cfg, self.split, self.tasks = cfg, split, tasks
        self.tokenizer, self.window, self.engine = tokenizer, window, engine
        self.rollout = self._rollout(workflow)

    @classmethod
    @contextmanager
    def open(cls, cfg: AjetConfig, *, split: EvalSplit = EvalSplit.train, check_task: str | None = None,
             timings: dict[str, float] | None = None) -> Iterator[Tryout]:
        """Build it, closed at the end; `check_task`: a task that must be in the split (checked
        first, before the seconds of loading). The heavy modules are imported here, as each part needs
        them: torch and transformers for the model, then the workflow with its agent framework
        and the gateway while the engine packs its weights in a thread (imports hold the GIL;
        FBGEMM's packing does not), so the two overlap on a CPU's cores. "engine start" is what
        is left of the packing after the imports."""
        timings = {} if timings is None else timings
        with _timed(timings, "tasks"):
            tasks = split_tasks(build_reader(cfg.task_reader, seed=cfg.project.seed, env=cfg.env), split)
            if check_task is not None:
                pick_task(tasks, check_task, split.value)
        with _timed(timings, "model load"):
            # imports torch and transformers: timed here, and not for `ajet episode --help`
            from ajet.rollout.local_engine import local_engine

            model, tokenizer = load_model_and_tokenizer(cfg.model)
            window = model_window(model, cfg.context.max_model_len)
        with ThreadPoolExecutor(1, thread_name_prefix="ajet-engine-start") as starting:
            started = starting.submit(local_engine, cfg, model, tokenizer, model_max_len=window, fixed_weights=True)
            try:
                with _timed(timings, "workflow import"):
                    workflow = _import_workflow(cfg.workflow.target)
            except BaseException:
                _close_when_started(started)
                raise
            with _timed(timings, "engine start"):
                engine = started.result()
        try:
            tryout = cls(cfg, split, tasks, tokenizer, window, engine, workflow)
        except BaseException:
            engine.close()
            raise
        try:
            yield tryout
        finally:
            tryout.rollout.close()
            engine.close()

    def _rollout(self, workflow: Workflow) -> EngineRollout[LocalEngine]:
        # imports agentscope and the gateway (see _import_workflow)
        from ajet.rollout.engine_rollout import EngineRollout

        return EngineRollout(self.cfg, self.engine, self.tokenizer, workflow, model_max_len=self.window, record=True)

    def reload(self) -> None:
        """Import the workflow's module again (and the modules beside it that it imports), and
        run the next episodes with it; the model and the engine stay. A module that fails to
        import raises `WorkflowLoadError` and leaves the previous workflow in place."""
        folder = _workflow_folder(self.cfg.workflow.target)
        if folder is not None:
            ours = set(_python_files(folder))
            for name, module in list(sys.modules.items()):
                path = getattr(module, "__file__", None)
                if path and Path(path).resolve() in ours:
                    del sys.modules[name]
        workflow = _import_workflow(self.cfg.workflow.target)
        self.rollout.close()
        self.rollout = self._rollout(workflow)

    def show(self, task: str = "0", n: int = 1, *, on_workflow_error: Callable[[BaseException], None] | None = None,
             timings: dict[str, float] | None = None) -> Shown:
        """Run `n` episodes of the task `task` (an index or an id) and return them as shown."""
        timings = {} if timings is None else timings
        index, chosen = pick_task(self.tasks, task, self.split.value)
        with _timed(timings, "episodes"), _workflow_errors(on_workflow_error):
            result = self.rollout.rollout([chosen], n, episode_prefix="try-")
        views = []
        for ep in sorted(result.episodes, key=lambda e: e.episode_id):
            samples = episode_samples(ep, self.cfg.context, self.window)[0] if ep.ok else []
            views.append(EpisodeView(ep, self.rollout.calls(ep.episode_id), samples,
                                     lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)))
        return Shown(task=chosen, index=index, split=self.split.value, views=views, timings=timings,
                     engine_dtype=self.engine.dtype)


def _import_workflow(target: str) -> Workflow:
    # The tuner that engine_rollout imports brings AgentScope, the gateway FastAPI.
    from ajet.rollout.engine_rollout import EngineRollout  # noqa: F401 - imported here, beside the packing

    return load_workflow(target)


def _workflow_folder(target: str) -> Path | None:
    """The folder of a `path/to/file.py:Name` target (what --watch watches and reloads), or
    None for a `package.module:Name` target."""
    module_part = target.rpartition(":")[0]
    return Path(module_part).expanduser().resolve().parent if module_part.endswith(".py") else None


def _python_files(folder: Path) -> list[Path]:
    """The Python files a workflow in `folder` may import from beside it: the folder's own and
    those of its packages (subfolders with an `__init__.py`), not a virtual env, a hidden
    folder or any other subfolder (a workflow at a project's root must not take its `.venv`)."""
    files = sorted(p.resolve() for p in folder.glob("*.py"))
    for sub in sorted(folder.iterdir()):
        if sub.is_dir() and not sub.name.startswith(".") and (sub / "__init__.py").is_file():
            files += _python_files(sub)
    return files


def watched_files(cfg: AjetConfig) -> list[Path]:
    """The files `ajet episode --watch` watches: the Python files beside a file workflow (its
    siblings and their packages: what it imports), or the module's own file."""
    folder = _workflow_folder(cfg.workflow.target)
    if folder is not None:
        return _python_files(folder)
    import importlib.util

    spec = importlib.util.find_spec(cfg.workflow.target.rpartition(":")[0])
    return [Path(spec.origin)] if spec is not None and spec.origin else []


Stamp = tuple[int, int, int]


def file_stamps(files: list[Path]) -> dict[Path, Stamp]:
    """Each file's (modification time in ns, size, inode); zeros for a file that is not there.
    The size and inode too: a save that truncates the file, then writes it, can fall in one tick
    of the kernel's clock, so a stamp taken between the two (a half-written file, whose import
    fails) would otherwise equal the finished file's, and that save would never be seen."""
    stamps: dict[Path, Stamp] = {}
    for f in files:
        try:
            st = f.stat()
        except FileNotFoundError:
            stamps[f] = (0, 0, 0)
            continue
        stamps[f] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return stamps


def wait_for_change(files: list[Path], before: dict[Path, Stamp] | None = None, *,
                    interval_s: float = 0.5) -> tuple[Path, dict[Path, Stamp]]:
    """Block until one of `files` differs from `before` (their `file_stamps` when the workflow
    was imported, so that a save during the episode counts; default: now) and return it with
    the stamps it was found at."""
    before = file_stamps(files) if before is None else before
    while True:
        now = file_stamps(files)
        changed = [f for f in files if now[f] != before.get(f, (0, 0, 0))]
        if changed:
            return changed[0], now
        time.sleep(interval_s)


def _close_when_started(started: Future[LocalEngine]) -> None:
    """Close the engine `started` builds, once it is built (the caller is leaving on an error)."""
    try:
        engine = started.result()
    except Exception:  # noqa: BLE001 - the caller's error is the one to report
        log.debug("the engine did not start either", exc_info=True)
        return
    engine.close()


@contextmanager
def _workflow_errors(hook: Callable[[BaseException], None] | None) -> Iterator[None]:
    """Call `hook` with each workflow exception where the runner catches it."""
    token = ON_WORKFLOW_ERROR.set(hook)
    try:
        yield
    finally:
        ON_WORKFLOW_ERROR.reset(token)


def for_debugger(cfg: AjetConfig) -> AjetConfig:
    """`cfg` for a session in the debugger: no episode timeout (a breakpoint would hit it)."""
    cfg.rollout = dataclasses.replace(cfg.rollout, episode_timeout_s=DEBUGGER_TIMEOUT_S)
    return cfg
