"""What a run that stops early leaves on disk (issue 52): the checkpoint of its last finished
step, never one labelled N that holds step N+1's weights (a resume would apply that update
twice), and the task reader as of the end of that step (a batch drawn for a step that was never
finished goes back to the reader instead of being skipped)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from ajet.config import load_config
from ajet.errors import DiskFullError
from ajet.own_thread import in_own_thread
from ajet.task_reader.base import TaskReader
from ajet.training.checkpoint_dir import checkpoint_step, latest_checkpoint
from ajet.training.loop import TrainingLoop
from ajet.training.recipe import Closers
from ajet.training.run_dir import prepare_run_dir
from ajet.workflow import WorkflowTask


class Tokenizer:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


def tasks(count: int) -> list[WorkflowTask]:
    return [WorkflowTask(task_id=f"t{i}", main_query=f"q{i}") for i in range(count)]


@pytest.fixture()
def run(two_calls_conf: Path, tmp_path: Path):
    """`run(save_every)`: a loop over a Linear model and SGD, whose steps each draw a batch of 2
    from a reader of 10 tasks and take one optimizer step; `fail(step, where)` makes a step
    raise: "before" the update (after drawing), "after" it (the Ctrl-C that in_own_thread
    raises once the update finished)."""
    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true",
                                       "logging.tensorboard=false", "trainer.save_final_model=false",
                                       "trainer.keep_checkpoints=0"])

    class Run:
        def __init__(self, save_every: int) -> None:
            self.cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, save_every=save_every))
            self.run_dir = prepare_run_dir(self.cfg, resume=False)
            torch.manual_seed(0)
            self.model = torch.nn.Linear(3, 1, bias=False)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.reader = TaskReader(tasks(10), seed=0)
            self.weights: dict[int, torch.Tensor] = {0: self.model.weight.detach().clone()}
            self.batches: dict[int, list[str]] = {}
            self.failure: tuple[int, str, BaseException] | None = None

        def step(self, step: int) -> dict[str, float]:
            self.batches[step] = [t.task_id for t in self.reader.next_batch(2, step=step)]
            if self.failure and self.failure[:2] == (step, "before"):
                raise self.failure[2]
            self.optimizer.zero_grad()
            self.model(torch.ones(1, 3)).sum().backward()
            if self.failure and self.failure[:2] == (step, "during"):  # Ctrl-C while the update runs
                in_own_thread(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.3),
                                           self.optimizer.step()))
            else:
                self.optimizer.step()
            if self.failure and self.failure[:2] == (step, "after"):
                raise self.failure[2]
            self.weights[step] = self.model.weight.detach().clone()
            return {"loss": float(step)}

        def train(self, total_steps: int, fail: tuple[int, str, BaseException] | None = None) -> TrainingLoop:
            self.failure = fail
            closers = Closers()
            loop = TrainingLoop(self.cfg, self.run_dir, closers, total_steps=total_steps)
            scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
            loop.attach(self.model, Tokenizer(), self.optimizer, scheduler,
                        state=lambda step: {"reader": self.reader.state_at_end_of(step)})
            try:
                with loop.steps() as steps:
                    for step in steps:
                        loop.commit(self.step(step))
            finally:
                closers.close_all()
            return loop

        def newest(self) -> tuple[int, torch.Tensor, dict]:
            ckpt = latest_checkpoint(self.run_dir / "checkpoints")
            assert ckpt is not None
            weights = torch.load(ckpt / "weights.pt", weights_only=True)["weight"]
            return checkpoint_step(ckpt), weights, torch.load(ckpt / "state.pt", weights_only=False)

    return Run


def test_ctrl_c_after_an_update_keeps_the_checkpoint_of_the_step_before_it(run) -> None:
    """Before: the loop saved a checkpoint labelled 2 with step 3's weights over the good one."""
    r = run(save_every=1)
    with pytest.raises(KeyboardInterrupt):
        r.train(5, fail=(3, "after", KeyboardInterrupt()))
    step, weights, _ = r.newest()
    assert step == 2
    assert torch.equal(weights, r.weights[2])
    assert not torch.equal(r.model.weight, r.weights[2])  # the model did move on: step 3's update


def test_ctrl_c_during_an_update_finishes_the_step_commits_it_and_stops(run) -> None:
    """The update ran to its end (in_own_thread), so the step is finished, not abandoned:
    logged, checkpointed with its own weights, then the run stops."""
    r = run(save_every=0)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            r.train(5, fail=(3, "during", KeyboardInterrupt()))
    finally:
        signal.signal(signal.SIGINT, previous)
    step, weights, state = r.newest()
    assert step == 3 and torch.equal(weights, r.weights[3])
    rows = [json.loads(line) for line in (r.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row["split"] == "train"] == [1, 2, 3]
    resumed = TaskReader(tasks(10), seed=0)
    resumed.load_state_dict(state["reader"])
    uninterrupted = TaskReader(tasks(10), seed=0)
    step4 = [[t.task_id for t in uninterrupted.next_batch(2, step=k)] for k in (1, 2, 3, 4)][-1]
    assert [t.task_id for t in resumed.next_batch(2, step=4)] == step4  # step 3's batch was trained


def test_an_error_before_the_update_saves_the_last_finished_step(run) -> None:
    """Before: only Ctrl-C saved; with save_every=0 (the default) an error lost every step."""
    r = run(save_every=0)
    with pytest.raises(RuntimeError, match="judge down"):
        r.train(5, fail=(3, "before", RuntimeError("judge down")))
    step, weights, _ = r.newest()
    assert step == 2 and torch.equal(weights, r.weights[2])


def test_the_batch_of_a_step_that_never_finished_goes_back_to_the_reader(run) -> None:
    r = run(save_every=0)
    with pytest.raises(KeyboardInterrupt):
        r.train(5, fail=(3, "before", KeyboardInterrupt()))
    _, _, state = r.newest()
    resumed = TaskReader(tasks(10), seed=0)
    resumed.load_state_dict(state["reader"])
    assert [t.task_id for t in resumed.next_batch(2, step=3)] == r.batches[3]  # not skipped


def test_a_full_disk_is_not_written_to_again(run, caplog: pytest.LogCaptureFixture) -> None:
    r = run(save_every=0)
    with pytest.raises(DiskFullError):
        r.train(5, fail=(3, "before", DiskFullError("no space left")))
    assert latest_checkpoint(r.run_dir / "checkpoints") is None
    assert "stopping on DiskFullError: no checkpoint was saved" in caplog.text


def test_a_reader_drawn_ahead_saves_its_position_before_the_later_draws() -> None:
    """Prefetch (rollout.max_staleness), `ajet serve`'s early groups: step 3's and 4's batches
    are drawn before step 2 ends; its state is the reader's before step 3's first draw."""
    reader = TaskReader(tasks(10), seed=0)
    drawn = {step: [t.task_id for t in reader.next_batch(2, step=step)] for step in (1, 2, 3, 4)}
    reader.next_batch(1, step=3)  # a refill of step 3's groups does not move its start
    again = TaskReader(tasks(10), seed=0)
    again.load_state_dict(reader.state_at_end_of(2))
    assert [t.task_id for t in again.next_batch(2, step=3)] == drawn[3]
    assert reader.state_at_end_of(4) == reader.state_dict()  # nothing drawn past step 4: now


def test_a_late_refill_of_a_committed_step_is_not_handed_out_again_after_a_resume() -> None:
    """`ajet serve` with dynamic sampling: step 1's refill is drawn after step 2's groups opened.
    Before, the state at the end of step 1 (before step 2's first draw) handed the refill's task
    out again on resume: it was trained twice in the epoch, and another task never."""
    reader = TaskReader(tasks(6), seed=0, shuffle=False)
    step1 = [t.task_id for t in reader.next_batch(2, step=1)]
    step2 = [t.task_id for t in reader.next_batch(1, step=2)]  # opened early (rollout.max_staleness, ajet serve)
    refill = [t.task_id for t in reader.next_batch(1, step=1)]  # step 1's group had no signal
    state = reader.state_at_end_of(1)
    assert state["skip"] == [[0, 3]]
    again = TaskReader(tasks(6), seed=0, shuffle=False)
    again.load_state_dict(state)
    resumed = [t.task_id for _ in range(3) for t in again.next_batch(1, step=2)]
    assert resumed == [*step2, "t4", "t5"]  # step 2's task again, then past the refill
    assert sorted(step1 + refill + resumed) == [f"t{i}" for i in range(6)]  # each task once in the epoch
    # a checkpoint of the resumed reader before it passed the skipped place keeps the skip
    again = TaskReader(tasks(6), seed=0, shuffle=False)
    again.load_state_dict(state)
    assert again.state_at_end_of(1)["skip"] == [[0, 3]]
    # the next epoch is whole again
    assert [t.task_id for t in TaskReader(tasks(6), seed=0, shuffle=False).next_batch(6, step=1)] == [
        f"t{i}" for i in range(6)]


def overlapped_recipe(update):  # noqa: ANN001, ANN201 - a stand-in for RLRecipe.update; the recipe
    """An RLRecipe with only what `_update_step` uses: an overlapping source (its prefetch does
    nothing), 5 steps, an event loop, and `update`."""
    import asyncio
    from types import SimpleNamespace

    from ajet.rl.recipe import RLRecipe
    from ajet.rollout.overlap import OverlappedEpisodes

    recipe = RLRecipe.__new__(RLRecipe)
    recipe.source = OverlappedEpisodes.__new__(OverlappedEpisodes)
    recipe.source.prefetch = lambda step: None
    recipe.cfg = SimpleNamespace(trainer=SimpleNamespace(total_steps=5))
    recipe.rollout = SimpleNamespace(event_loop=asyncio.new_event_loop())
    recipe.update = update
    return recipe


def test_ctrl_c_during_an_overlapped_update_waits_for_it_to_finish() -> None:
    """rollout.max_staleness > 0: the update runs in a worker thread while the event loop rolls
    out the next step. Ctrl-C reaches the main thread; before, it left at once and the loop
    then copied the weights into a checkpoint while optimizer.step() was still changing them."""
    events: list[str] = []

    def update(batch, *, step, overlap):  # noqa: ANN001, ANN202 - stands in for RLRecipe.update
        events.append("update begins")
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        time.sleep(0.5)
        events.append("update ends")
        return {}

    recipe = overlapped_recipe(update)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            recipe._update_step(None, 1)
        events.append("stopped")
    finally:
        signal.signal(signal.SIGINT, previous)
        recipe.rollout.event_loop.close()
    assert events == ["update begins", "update ends", "stopped"]


def test_ctrl_c_during_an_overlapped_update_inside_a_step_finishes_the_step() -> None:
    """Inside the loop's step (`stop_at_step_end`) the finished update's metrics come back and
    the stop waits for the step's end."""
    from ajet.signals import stop_at_step_end, take_requested_stop

    def update(batch, *, step, overlap):  # noqa: ANN001, ANN202 - stands in for RLRecipe.update
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
        return {"actor/loss": 1.5}

    recipe = overlapped_recipe(update)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stop_at_step_end(lambda: False):  # the stop reaches _update_step: it finishes the update
            metrics = recipe._update_step(None, 1)
    finally:
        signal.signal(signal.SIGINT, previous)
        recipe.rollout.event_loop.close()
    assert metrics == {"actor/loss": 1.5}
    assert take_requested_stop() == "SIGINT" and take_requested_stop() is None


def test_the_non_finite_counters_survive_a_resume(run) -> None:
    """Before, a resume reset trainer.max_nonfinite_steps' count: a run that diverged every few
    steps and was resumed each time never hit the limit."""
    from ajet.training.step import OptimizerStep

    r = run(save_every=1)
    counters = OptimizerStep(r.model, r.optimizer, r.cfg.trainer)
    counters.nonfinite_in_a_row, counters.nonfinite_total = 2, 5
    closers = Closers()
    loop = TrainingLoop(r.cfg, r.run_dir, closers, total_steps=1)
    loop.attach(r.model, Tokenizer(), r.optimizer, torch.optim.lr_scheduler.LambdaLR(r.optimizer, lambda _: 1.0))
    counters.keep_in(loop)
    with loop.steps() as steps:
        for step in steps:
            loop.commit(r.step(step))
    closers.close_all()

    again = OptimizerStep(r.model, r.optimizer, r.cfg.trainer)
    loop = TrainingLoop(r.cfg, r.run_dir, closers, total_steps=2, resume=True)
    loop.attach(r.model, Tokenizer(), r.optimizer, torch.optim.lr_scheduler.LambdaLR(r.optimizer, lambda _: 1.0))
    again.keep_in(loop)
    loop.restore()
    closers.close_all()
    assert (again.nonfinite_in_a_row, again.nonfinite_total) == (2, 5)


@pytest.mark.parametrize(("minutes", "saved"), [(1e-9, [1, 2, 3]), (0.0, [])])
def test_checkpoints_by_time_are_on_by_default_and_bounded(run, minutes: float, saved: list[int]) -> None:
    """trainer.save_every_minutes (default 10): a crash loses at most that much training. Here
    the interval is a nanosecond (every step) or off; the last step's is save_last_checkpoint's."""
    from ajet.config.schema import TrainerConfig

    assert TrainerConfig().save_every_minutes == 10 and TrainerConfig().keep_checkpoints == 2
    r = run(save_every=0)
    r.cfg = dataclasses.replace(r.cfg, trainer=dataclasses.replace(
        r.cfg.trainer, save_every_minutes=minutes, save_last_checkpoint=False))
    r.train(4)
    steps = sorted(checkpoint_step(p) for p in (r.run_dir / "checkpoints").glob("step_*"))
    assert steps == saved


def test_resume_refuses_a_latest_pointer_outside_the_checkpoints_and_a_file_that_runs_code(run) -> None:
    """A run directory from elsewhere: `latest` may name any path, and a pickle any code."""
    from ajet.errors import RunDataError
    from ajet.training.checkpoint import load_checkpoint

    r = run(save_every=1)
    r.train(2)
    ckpt_root = r.run_dir / "checkpoints"
    (ckpt_root / "latest").write_text("../../../etc")
    with pytest.raises(RunDataError, match=r"latest names '\.\./\.\./\.\./etc', not a checkpoint"):
        latest_checkpoint(ckpt_root)
    (ckpt_root / "latest").write_text("step_000002")

    class Exploit:
        def __reduce__(self):  # noqa: ANN204 - what a crafted file does
            return (os.system, ("touch pwned",))

    torch.save({"step": 2, "exploit": Exploit()}, ckpt_root / "step_000002" / "state.pt")
    scheduler = torch.optim.lr_scheduler.LambdaLR(r.optimizer, lambda _: 1.0)
    with pytest.raises(RunDataError, match="cannot be loaded safely"):
        load_checkpoint(ckpt_root / "step_000002", model=r.model, optimizer=r.optimizer, scheduler=scheduler)
    assert not Path("pwned").exists()
    (ckpt_root / "step_000002" / "optimizer.pt").write_bytes(b"\x80\x02torn")
    with pytest.raises(RunDataError, match="optimizer.pt cannot be loaded safely"):
        load_checkpoint(ckpt_root / "step_000002", model=r.model, optimizer=r.optimizer, scheduler=scheduler)


# ---------------------------------------------------------------- issue 69 §2: stops that land anywhere


def test_an_update_counts_as_begun_from_its_first_forward(run) -> None:
    """Before, the weights counted as the last step's until optimizer.step() began: a stop during
    the forward/backward (under --with-ray, whose handler raised at once) saved "step N" while
    the update thread then stepped (AdamW's state counted 2 in step_000001)."""
    from ajet.training.step import OptimizerStep

    r = run(save_every=0)
    loop = TrainingLoop(r.cfg, r.run_dir, Closers(), total_steps=1)
    loop.attach(r.model, Tokenizer(), r.optimizer, torch.optim.lr_scheduler.LambdaLR(r.optimizer, lambda _: 1.0))
    optimizer_step = OptimizerStep(r.model, r.optimizer, r.cfg.trainer)
    optimizer_step.keep_in(loop)
    seen = []

    def seq_loss(seq):  # noqa: ANN001, ANN202 - the forward of one packed sequence
        seen.append(loop.weights_are_of_last_step)
        return r.model(torch.ones(1, 3)).sum(), {}

    assert loop.weights_are_of_last_step
    optimizer_step.run([type("Seq", (), {"entry_pos": [0], "role": ""})()], seq_loss)
    assert seen == [False]


def test_a_stop_whose_keyboardinterrupt_is_lost_still_stops_the_run(run) -> None:
    """Python drops an exception raised while it runs a weakref callback: a stop that landed
    there was lost and the run trained to its end, exit 0 (6 of ~300 random stops). The stop is
    recorded first, and the loop acts on the record at its next safe point."""
    import weakref

    from ajet.signals import stop_on_signals

    r = run(save_every=0)
    step_of_stop = 2
    original = r.step

    def step(k: int) -> dict[str, float]:
        if k == step_of_stop:
            class Thing:
                pass

            thing = Thing()
            ref = weakref.ref(thing, lambda _: (signal.raise_signal(signal.SIGTERM), sum(range(1000))))
            del thing  # the callback runs: the handler's KeyboardInterrupt is raised inside it and dropped
            assert ref() is None
        return original(k)

    r.step = step
    with stop_on_signals(), pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        r.train(5)
    rows = [json.loads(line) for line in (r.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row["split"] == "train"] == [1, 2]  # stopped at step 2's end
    assert r.newest()[0] == 2


def _stop_during_checkpoint_writes(monkeypatch: pytest.MonkeyPatch, signals: int, at_step: int) -> list[str]:
    """Patch the checkpoint's file writer: at step `at_step`'s first file, `signals` SIGINTs arrive
    while it writes; the events say whether each write ran to its end."""
    import ajet.training.checkpoint as checkpoint

    events: list[str] = []
    real = checkpoint._save

    def slow_save(path: Path, obj: object) -> str:
        if f"step_{at_step:06d}" not in path.parent.name:
            return real(path, obj)
        fire = path.name == "weights.pt" and not events
        events.append(f"begin {path.name}")
        if fire:
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here
        digest = real(path, obj)
        events.append(f"end {path.name}")
        return digest

    monkeypatch.setattr(checkpoint, "_save", slow_save)
    return events


def test_a_stop_during_a_checkpoint_write_waits_for_it_then_stops(run, monkeypatch) -> None:
    """Before, the stop raised inside torch.save: the write failed (RuntimeError "unexpected
    pos"), the loop logged "stopping on RuntimeError", saved again and exited 1."""
    from ajet.signals import stop_on_signals

    r = run(save_every=1)
    events = _stop_during_checkpoint_writes(monkeypatch, signals=1, at_step=2)
    with stop_on_signals(), pytest.raises(KeyboardInterrupt, match="SIGINT") as raised:
        r.train(5)
    assert type(raised.value) is KeyboardInterrupt
    assert events == ["begin weights.pt", "end weights.pt", "begin optimizer.pt", "end optimizer.pt",
                      "begin state.pt", "end state.pt"]  # written once, whole; no second save
    step, weights, _ = r.newest()
    assert step == 2 and torch.equal(weights, r.weights[2])


def test_a_second_stop_during_a_checkpoint_write_stops_at_once_and_keeps_the_one_before(run, monkeypatch) -> None:
    from ajet.signals import StopNow, stop_on_signals

    r = run(save_every=1)
    _stop_during_checkpoint_writes(monkeypatch, signals=2, at_step=2)
    with stop_on_signals(), pytest.raises(StopNow):
        r.train(5)
    step, weights, _ = r.newest()
    assert step == 1 and torch.equal(weights, r.weights[1])
    assert not list((r.run_dir / "checkpoints").glob(".tmp-*"))  # the torn one is gone


def test_a_flipped_bit_in_a_checkpoint_is_found_and_the_resume_takes_the_one_before(
        run, caplog: pytest.LogCaptureFixture) -> None:
    """Before, one flipped bit in weights.pt resumed silently with weights off by up to 1921."""
    r = run(save_every=1)
    r.train(2)
    weights = r.run_dir / "checkpoints" / "step_000002" / "weights.pt"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x10
    weights.write_bytes(bytes(data))
    loop = TrainingLoop(r.cfg, r.run_dir, Closers(), total_steps=3, resume=True)
    assert loop.resume_step() == 1
    assert "checkpoint step_000002 is corrupt (weights.pt does not match the sha256" in caplog.text
    assert (r.run_dir / "checkpoints" / "corrupt-step_000002").is_dir()
    loop.attach(r.model, Tokenizer(), r.optimizer, torch.optim.lr_scheduler.LambdaLR(r.optimizer, lambda _: 1.0))
    assert loop.restore()["step"] == 1
    assert torch.equal(r.model.weight, r.weights[1])


def test_a_resume_applies_a_changed_learning_rate_and_says_so(run, caplog: pytest.LogCaptureFixture) -> None:
    """Before, trainer.lr changed from 0.01 to 0.001 on --resume was accepted and ignored: the
    schedule's saved state kept the old rate for every later step."""
    r = run(save_every=1)
    r.train(2)  # SGD at lr 0.1
    optimizer = torch.optim.SGD(r.model.parameters(), lr=0.01)  # trainer.lr=0.01 in the resumed config
    loop = TrainingLoop(r.cfg, r.run_dir, Closers(), total_steps=3, resume=True)
    loop.attach(r.model, Tokenizer(), optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 0.5))
    loop.restore()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.005)  # the new rate, the schedule's factor
    assert loop.scheduler.get_last_lr() == [pytest.approx(0.005)]
    assert "trainer.lr is 0.01 in this config and 0.1 in the checkpoint" in caplog.text


def test_a_checkpoint_of_another_shape_is_refused_with_a_message(run) -> None:
    from ajet.errors import RunDataError
    from ajet.training.checkpoint import load_trainable_weights

    r = run(save_every=1)
    r.train(1)
    other = torch.nn.Linear(4, 1, bias=False)
    with pytest.raises(RunDataError, match=r"another shape .*weight: \[1, 3\] saved, \[1, 4\] now"):
        load_trainable_weights(r.run_dir / "checkpoints" / "step_000001", other)


def test_an_update_that_leaves_non_finite_weights_stops_the_run(run) -> None:
    """Before, a damaged optimizer state turned every weight into NaN and the run exited 0."""
    from ajet.errors import DivergedError
    from ajet.training.step import OptimizerStep

    r = run(save_every=0)
    optimizer = torch.optim.SGD(r.model.parameters(), lr=float("inf"))  # finite gradients, infinite step
    step = OptimizerStep(r.model, optimizer, r.cfg.trainer)
    seq = type("Seq", (), {"entry_pos": [0], "role": ""})()
    with pytest.raises(DivergedError, match="left non-finite values in 1 trained weight"):
        step.run([seq], lambda s: (r.model(torch.ones(1, 3)).sum(), {}), step=4)


def test_a_step_that_trains_a_group_drawn_for_a_later_step_resumes_without_doubles_or_gaps() -> None:
    """`ajet serve` with a slow client (issue 69 §2): step 1 trains the first complete groups,
    g1 and g3 (g3 drawn for step 2), while a client holds g2. Before, the checkpoint's reader
    resumed after g2 and before g3: t5 trained 3 times in the run and t2 once. Now every task
    trains exactly once an epoch."""
    def run(reader: TaskReader, draws: dict[str, tuple[int, WorkflowTask]], name: str, step: int) -> None:
        (task,) = reader.next_batch(1, step=step)
        draws[name] = (reader.last_draws[0], task)

    reader = TaskReader(tasks(6), seed=0)
    reader.track_trained()
    draws: dict[str, tuple[int, WorkflowTask]] = {}
    for name, step in (("g1", 1), ("g2", 1), ("g3", 2), ("g4", 2)):
        run(reader, draws, name, step)
    trained = [draws["g1"][1].task_id, draws["g3"][1].task_id]
    reader.mark_trained([draws["g1"][0], draws["g3"][0]], 1)
    state = reader.state_at_end_of(1)  # checkpoint 1, then SIGTERM, then --resume

    resumed = TaskReader(tasks(6), seed=0)
    resumed.track_trained()
    resumed.load_state_dict(state)
    trained += [t.task_id for t in resumed.next_batch(10, step=2)]  # steps 2..6 of 2 groups: the rest
    assert sorted(trained) == sorted([f"t{i}" for i in range(6)] * 2)
    assert trained[2] == draws["g2"][1].task_id  # the held group is handed out again, first


def test_a_reader_that_tracks_training_keeps_an_unmarked_draw_open() -> None:
    """A draw no committed step trained goes back; one a later step (not committed) trained too."""
    reader = TaskReader(tasks(4), seed=0, shuffle=False)
    reader.track_trained()
    first = reader.next_batch(2, step=1)
    reader.mark_trained(reader.last_draws[:1], 1)
    reader.mark_trained(reader.last_draws[1:], 2)  # step 2 took it, and never committed
    resumed = TaskReader(tasks(4), seed=0, shuffle=False)
    resumed.load_state_dict(reader.state_at_end_of(1))
    assert [t.task_id for t in resumed.next_batch(3, step=2)] == [first[1].task_id, "t2", "t3"]


def test_a_full_disk_while_writing_a_steps_records_is_a_message_and_leaves_no_temp_file(tmp_path, monkeypatch) -> None:
    """Before: a traceback from write_step_records, and step_000004.jsonl.tmp left behind."""
    import builtins
    import errno

    import ajet.outputs.records as records

    real_open = builtins.open

    class Full:
        def __init__(self, handle) -> None:  # noqa: ANN001
            self.handle = handle

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, data: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)
    from ajet.context.types import Sample

    sample = Sample(input_ids=[1, 2], loss_mask=[0, 1], old_logprobs=[0.0, -1.0], advantage=[0.0, 1.0],
                    group_id="g", episode_id="e")
    with pytest.raises(DiskFullError, match="token records of step 4 could not be written.*no space left"):
        records.write_step_records(tmp_path, 4, [sample], decode_token=str, episode_info={})
    assert not list((tmp_path / "records").iterdir())


def test_resume_changed_goes_on_over_changed_tasks_and_plain_resume_refuses_them(caplog) -> None:
    """Before, --resume-changed still refused a changed task file, though the flag exists for it."""
    from ajet.errors import TaskReaderError

    reader = TaskReader(tasks(6), seed=0)
    reader.next_batch(4, step=1)
    reader.next_batch(4, step=2)  # into epoch 1
    state = reader.state_at_end_of(2)
    changed = TaskReader(tasks(9), seed=0)
    with pytest.raises(TaskReaderError, match="--resume-changed"):
        changed.load_state_dict(state)
    changed.load_state_dict(state, allow_changed=True)
    assert changed.epoch == 1
    assert len({t.task_id for t in changed.next_batch(9, step=3)}) == 9  # the new epoch from its start
    assert "the train tasks changed since the checkpoint (6 tasks then, 9 now)" in caplog.text


def test_a_second_ctrl_c_during_an_overlapped_update_is_stopnow() -> None:
    """Before, the first stop was caught in _update_step with no record, so the second raised a
    plain KeyboardInterrupt and the loop saved from weights the update was still changing."""
    from ajet.signals import StopNow, stop_on_signals

    def update(batch, *, step, overlap):  # noqa: ANN001, ANN202 - stands in for RLRecipe.update
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)  # the second, while _update_step waits for this update
        time.sleep(0.3)
        return {}

    recipe = overlapped_recipe(update)
    try:
        with stop_on_signals(), pytest.raises(StopNow):
            recipe._update_step(None, 1)
    finally:
        recipe.rollout.event_loop.close()


def test_finite_weights_whose_sum_overflows_are_not_taken_for_non_finite() -> None:
    """check_finite sums each tensor first (cheap) and looks element by element only when a sum
    is not finite: an overflow of finite weights must not stop the run, a NaN must."""
    from ajet.errors import DivergedError
    from ajet.training.step import check_finite

    model = torch.nn.Linear(8, 4)
    with torch.no_grad():
        model.weight.fill_(3e38)  # every weight finite; their sum is inf
    check_finite(model, 1)
    with torch.no_grad():
        model.bias[1] = float("nan")
    with pytest.raises(DivergedError, match=r"1 trained weight tensor\(s\) \(e.g. bias\)"):
        check_finite(model, 2)


def test_a_crafted_complete_marker_cannot_make_a_resume_read_another_file(run) -> None:
    """`.complete`'s sha256 map names the checkpoint's own files only: a run directory from
    elsewhere naming `../../x` (or a FIFO there) is a corrupt checkpoint, never a read outside."""
    from ajet.training.checkpoint import corruption

    r = run(save_every=1)
    r.train(1)
    ckpt = r.run_dir / "checkpoints" / "step_000001"
    assert corruption(ckpt) == ""
    (ckpt / ".complete").write_text(json.dumps({"step": 1, "sha256": {"../../../../etc/passwd": "0"}}))
    assert corruption(ckpt).startswith(".complete names '../../../../etc/passwd', not a file of a checkpoint")
