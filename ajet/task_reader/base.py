"""`TaskReader`: the train/val/test task lists plus an endless, resumable batch iterator.

Every reader type (jsonl, hf_dataset, env_service, generate) produces lists of
`WorkflowTask`: train, val, and (jsonl's `test_path`) test. Val is the split settings are
tuned on and training validates on; test is only reported on (`eval.split: test`). This
class owns what they share: the deterministic validation hold-out, epoch shuffling by
`seed + epoch`, and a `state_dict` so a resumed run continues with exactly the batches an
uninterrupted run would have drawn.

A checkpoint of step N saves `state_at_end_of(N)`: the reader as it was before step N+1's
first draw. Batches are drawn ahead of their step (the next step's rollout during an update,
`ajet serve`'s groups opened early, a stop during step N+1's rollout); the tasks of a step that
was never committed go back to the reader on resume instead of being skipped.

Where a step may train tasks drawn for another step (`ajet serve`: the first complete groups
train, and a slow client may hold a group drawn earlier), the source says which draws each step
trained (`track_trained`, then `mark_trained(last_draws, step)`): the saved state is the reader
before its earliest draw that no committed step trained, with every later draw that one did
trained skipped. So on resume each open group is handed out again and no trained one is.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Sequence

from ajet.config.schema import EvalSplit
from ajet.errors import EvalError, TaskReaderError
from ajet.faults import fault_point
from ajet.task_reader.curriculum import Curriculum
from ajet.task_reader.selection import Outcome, TaskSelection
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)


def holdout_split(
    tasks: Sequence[WorkflowTask], val_fraction: float, seed: int
) -> tuple[list[WorkflowTask], list[WorkflowTask]]:
    """Split `tasks` into (train, val) with `round(len * val_fraction)` val tasks (at least one).

    The choice depends only on `seed` and the task count, so a rerun holds out the same tasks;
    both parts keep the source order.
    """
    if not 0 <= val_fraction < 1:
        raise TaskReaderError(f"task_reader.val_fraction={val_fraction} must be in [0, 1)")
    if val_fraction == 0 or not tasks:
        return list(tasks), []
    n_val = max(1, round(len(tasks) * val_fraction))
    if n_val >= len(tasks):
        raise TaskReaderError(
            f"task_reader.val_fraction={val_fraction} holds out all {len(tasks)} tasks; "
            "lower it or provide more tasks"
        )
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    val_idx = set(order[:n_val])
    train = [t for i, t in enumerate(tasks) if i not in val_idx]
    val = [t for i, t in enumerate(tasks) if i in val_idx]
    return train, val


def _fingerprint(tasks: Sequence[WorkflowTask]) -> str:
    digest = hashlib.sha1()
    for task in tasks:
        digest.update(task.task_id.encode("utf-8") + b"\0")
    return digest.hexdigest()[:16]


class TaskReader:
    """Train, val and test tasks; `next_batch` walks endless epochs over the train tasks.

    `skipped` counts source records that were dropped (malformed lines, unparsable
    generations) so the caller can log it.
    """

    def __init__(
        self,
        train: Sequence[WorkflowTask],
        val: Sequence[WorkflowTask] = (),
        *,
        seed: int = 0,
        shuffle: bool = True,
        skipped: int = 0,
        source: str = "",
        curriculum: Curriculum | None = None,
        test: Sequence[WorkflowTask] = (),
        selection: TaskSelection | None = None,
    ) -> None:
        if not train:
            raise TaskReaderError(f"no train tasks from {source or 'the task source'}; check the data")
        self._train = list(train)
        self._val = list(val)
        self._test = list(test)
        self.seed = seed
        self.shuffle = shuffle
        self.skipped = skipped
        self.source = source
        self._epoch = 0
        self._position = 0  # index into the current epoch's order
        self._order = self._epoch_order(0)
        # With a curriculum, batches are drawn from its pool instead of walking epochs.
        self.curriculum = curriculum
        self._draws = 0
        # `task_reader.selection`: the epoch walk passes over tasks the policy always or never solves.
        self.selection = selection
        # For `state_at_end_of`: each step's state before its first draw, with the number of
        # tasks drawn by then, and every task drawn as (draw number, step, epoch, position).
        self._before_step: dict[int, tuple[dict, int]] = {}
        self._drawn: list[tuple[int, int, int, int]] = []
        self._draw_count = 0
        # Positions (epoch, position) trained before a resume although drawn after the saved
        # position (a step's late draw: `ajet serve`'s dynamic-sampling refill): skipped, once.
        self._skip: set[tuple[int, int]] = set()
        # `track_trained`: which draw each step trained, and the state before each open draw.
        self._tracking = False
        self._trained: dict[int, int] = {}  # draw number -> the step that trained it
        self._before_draw: dict[int, dict] = {}
        self.last_draws: list[int] = []  # the draw numbers of the last `next_batch`
        self._train_fingerprint = _fingerprint(self._train)
        # `ajet serve` draws on the gateway's thread while the trainer's saves the state.
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return (
            f"TaskReader({self.source!r}, train={len(self._train)}, val={len(self._val)}, test={len(self._test)}, "
            f"skipped={self.skipped}, epoch={self._epoch}, position={self._position})"
        )

    @property
    def epoch(self) -> int:
        """The epoch the next task will come from (0-based)."""
        return self._epoch

    def train_tasks(self) -> list[WorkflowTask]:
        return list(self._train)

    def val_tasks(self) -> list[WorkflowTask]:
        return list(self._val)

    def test_tasks(self) -> list[WorkflowTask]:
        return list(self._test)

    def next_batch(self, batch_size: int, *, step: int = 1) -> list[WorkflowTask]:
        """The next `batch_size` train tasks; a batch may run across an epoch boundary.

        With a curriculum, the tasks come from its pool at training step `step`."""
        with self._lock:
            return self._next_batch(batch_size, step)

    def _next_batch(self, batch_size: int, step: int) -> list[WorkflowTask]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        fault_point("draw")
        if step not in self._before_step:
            self._before_step[step] = (self.state_dict(), self._draw_count)
        if self.curriculum is not None:  # its position is the number of draws (curriculum_draws)
            idx = self.curriculum.draw(batch_size, step, self._draws)
            self._draws += 1
            self.last_draws = list(range(self._draw_count, self._draw_count + len(idx)))
            self._draw_count += len(idx)
            return [self._train[i] for i in idx]
        batch: list[WorkflowTask] = []
        self.last_draws = []
        passed_over = 0
        while len(batch) < batch_size:
            if self._position >= len(self._order):
                self._epoch += 1
                self._position = 0
                self._order = self._epoch_order(self._epoch)
            at = (self._epoch, self._position)
            self._position += 1
            if at in self._skip:  # trained before the resume
                self._skip.discard(at)
                continue
            task = self._train[self._order[at[1]]]
            if self.selection is not None:
                # Passed over only while the walk has drawn something this epoch pass: a train set
                # the policy has settled entirely is still drawn from.
                if passed_over < len(self._train) and self.selection.passes_over(task.task_id, at[0]):
                    passed_over += 1
                    continue
                self.selection.drawn(task.task_id, at[0])
            if self._tracking:  # the state before this draw: where a resume begins while it is open
                self._before_draw[self._draw_count] = {**self.state_dict(), "epoch": at[0], "position": at[1]}
            self.last_draws.append(self._draw_count)
            self._drawn.append((self._draw_count, step, *at))
            self._draw_count += 1
            batch.append(task)
        return batch

    def observe(self, outcomes: Sequence[Outcome]) -> dict[str, float]:
        """A step's episodes, for `task_reader.selection`; its metrics (none without it)."""
        if self.selection is None:
            return {}
        with self._lock:
            self.selection.observe(outcomes)
            return {"reader/selection_skipped": float(self.selection.take_skipped()),
                    "reader/settled_share": self.selection.settled_share(len(self._train))}

    def state_dict(self) -> dict:
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_train": len(self._train),
            "train_fingerprint": self._train_fingerprint,
            "curriculum_draws": self._draws,
            "skip": sorted([e, p] for e, p in self._skip),
            **({"selection": self.selection.state_dict()} if self.selection is not None else {}),
        }

    def track_trained(self) -> None:
        """From now on a draw counts as trained only once `mark_trained` says which step trained
        it (the source trains tasks out of the order they were drawn in)."""
        self._tracking = True

    def mark_trained(self, draws: list[int], step: int) -> None:
        """Step `step` trained (or used up) the tasks of these draws (`last_draws` numbers)."""
        with self._lock:
            for draw in draws:
                self._trained[draw] = step

    def state_at_end_of(self, step: int) -> dict:
        """The state as of the end of `step`: before the first draw of any later step (drawn
        ahead), else now. A task of `step` or earlier drawn after that draw (a late refill) is
        in the state's `skip`, so a resumed reader does not hand it out again. What was recorded
        for `step` and earlier is forgotten. With `track_trained`: before the earliest draw that
        no step up to `step` trained, every later draw those steps trained skipped."""
        with self._lock:
            # A curriculum's position is its count of draws, not a walk over the tasks: a step's
            # state is the count before the next step's first draw, whoever trains what.
            tracked = self._tracking and self.curriculum is None
            return self._state_of_trained(step) if tracked else self._state_of_drawn(step)

    def _state_of_drawn(self, step: int) -> dict:
        later = [s for s in self._before_step if s > step]
        if not later:
            state = self.state_dict()
        else:
            saved, cut = self._before_step[min(later)]
            late = [[e, p] for n, s, e, p in self._drawn if n >= cut and s <= step]
            state = {**saved, "skip": sorted(saved.get("skip", []) + late)}
        self._before_step = {s: v for s, v in self._before_step.items() if s > step}
        oldest = min((n for _, n in self._before_step.values()), default=self._draw_count)
        self._drawn = [d for d in self._drawn if d[0] >= oldest]
        return state

    def _state_of_trained(self, step: int) -> dict:
        trained = {n for n, s in self._trained.items() if s <= step}
        open_draws = [d for d in self._drawn if d[0] not in trained]
        if not open_draws:
            state = self.state_dict()
            cut = self._draw_count
        else:
            cut = open_draws[0][0]
            late = [[e, p] for n, _, e, p in self._drawn if n > cut and n in trained]
            saved = self._before_draw[cut]
            state = {**saved, "skip": sorted(saved.get("skip", []) + late)}
        # What lies before the cut is trained and will never be asked for again.
        self._before_step = {s: v for s, v in self._before_step.items() if s > step}
        self._drawn = [d for d in self._drawn if d[0] >= cut]
        self._before_draw = {n: v for n, v in self._before_draw.items() if n >= cut}
        self._trained = {n: s for n, s in self._trained.items() if n >= cut}
        return state

    def load_state_dict(self, state: dict, *, allow_changed: bool = False) -> None:
        """Continue where the saved reader stopped. The train set must be the same, unless
        `allow_changed` (`--resume-changed`): then the saved epoch goes on over the new tasks,
        from its beginning (a position in the old order means nothing in the new one)."""
        with self._lock:
            if state.get("train_fingerprint") == self._train_fingerprint:
                self._load_state_dict(state)
                return
            then = f"({state.get('num_train')} tasks then, {len(self._train)} now)"
            if not allow_changed:
                raise TaskReaderError(
                    f"cannot resume the task reader: the train tasks changed since the checkpoint {then}. Resume "
                    "with the same task data, pass --resume-changed to go on over the new tasks, or start a "
                    "fresh run.")
            logger.warning("--resume-changed: the train tasks changed since the checkpoint %s: epoch %s goes on "
                           "over the new tasks from their beginning", then, state.get("epoch"))
            self._load_state_dict({**state, "train_fingerprint": self._train_fingerprint,
                                   "num_train": len(self._train), "position": 0, "skip": []})

    def _load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self._epoch = int(state["epoch"])
        self._position = int(state["position"])
        self._draws = int(state.get("curriculum_draws", 0))
        self._skip = {(int(e), int(p)) for e, p in state.get("skip", [])}
        if self.selection is not None and "selection" in state:
            self.selection.load_state_dict(state["selection"])
        self._order = self._epoch_order(self._epoch)
        self._before_step, self._drawn = {}, []
        self._trained, self._before_draw = {}, {}

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._train)))
        if self.shuffle:
            # A string seed hashes deterministically (sha512), unlike hash() of a tuple.
            random.Random(f"ajet-{self.seed}-{epoch}").shuffle(order)
        return order


def split_tasks(reader: TaskReader, split: EvalSplit) -> list[WorkflowTask]:
    """The tasks of `split`; an `EvalError` saying which key to set when it has none."""
    tasks = {EvalSplit.train: reader.train_tasks, EvalSplit.val: reader.val_tasks,
             EvalSplit.test: reader.test_tasks}[split]()
    if not tasks:
        where = {EvalSplit.val: "task_reader.jsonl.val_path (or task_reader.val_fraction)",
                 EvalSplit.test: "task_reader.jsonl.test_path"}.get(split, "task_reader.jsonl.train_path")
        raise EvalError(f"the {split.value} split has no tasks; set {where}, or evaluate another --split")
    return tasks
