"""The shared training core (ajet/training): the recipe runner's cleanup and the step loop's
schedule, checkpoint and logging rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ajet.config import load_config
from ajet.training.recipe import Closers, run_recipe
from ajet.training.run_dir import run_dir_of


class Recorder:
    def __init__(self, fail_in: str = "") -> None:
        self.fail_in = fail_in
        self.events: list[str] = []

    def setup(self, closers: Closers) -> None:
        for name in ("engine", "gateway", "metrics"):
            self.events.append(f"start {name}")
            closers.push(lambda name=name: self.events.append(f"close {name}"), name)
            if self.fail_in == name:
                raise RuntimeError(f"failed after {name}")
        closers.push(self._broken_closer, "broken")

    def _broken_closer(self) -> None:
        raise OSError("this closer fails; the others still run")

    def train(self) -> Path:
        self.events.append("train")
        if self.fail_in == "train":
            raise KeyboardInterrupt
        return Path("run")


def test_run_recipe_closes_everything_started_in_reverse_order() -> None:
    ok = Recorder()
    assert run_recipe(ok) == Path("run")
    assert ok.events == ["start engine", "start gateway", "start metrics", "train",
                         "close metrics", "close gateway", "close engine"]
    half = Recorder(fail_in="gateway")
    with pytest.raises(RuntimeError, match="failed after gateway"):
        run_recipe(half)
    assert half.events == ["start engine", "start gateway", "close gateway", "close engine"]
    interrupted = Recorder(fail_in="train")
    with pytest.raises(KeyboardInterrupt):
        run_recipe(interrupted)
    assert interrupted.events[-3:] == ["close metrics", "close gateway", "close engine"]


def test_rl_setup_failure_after_the_gateway_started_closes_gateway_and_engine(
        two_calls_conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ajet.rollout.engine_rollout
    import ajet.training.rollout_run
    from ajet.rl.recipe import train

    built: list[ajet.rollout.engine_rollout.EngineRollout] = []
    init = ajet.rollout.engine_rollout.EngineRollout.__init__

    def recording_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        built.append(self)

    def failing_optimizer(*args, **kwargs):
        raise RuntimeError("optimizer could not be built")

    monkeypatch.setattr(ajet.rollout.engine_rollout.EngineRollout, "__init__", recording_init)
    monkeypatch.setattr(ajet.training.rollout_run, "build_optimizer", failing_optimizer)
    cfg = load_config(two_calls_conf, [f"project.exp_dir={two_calls_conf.parent / 'exp'}", "logging.quiet=true"])
    with pytest.raises(RuntimeError, match="optimizer could not be built"):
        train(cfg)
    (rollout,) = built
    assert not rollout.gateway.running
    assert not rollout.engine._scheduler.thread.is_alive()
    assert rollout.event_loop.is_closed()


def test_training_loop_steps_the_schedule_once_per_step_and_logs_each_step_once(
        two_calls_conf: Path, tmp_path: Path) -> None:
    import torch

    from ajet.training.loop import TrainingLoop
    from ajet.training.optim import build_optimizer

    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true",
                                       "trainer.total_steps=4", "trainer.warmup_steps=2", "trainer.lr=0.1",
                                       "trainer.lr_schedule=linear", "trainer.save_every=2",
                                       "trainer.save_final_model=false", "trainer.val_every=0"])
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = build_optimizer(model, cfg.trainer)
    closers = Closers()
    run_dir = tmp_path / "exp" / cfg.project.name
    run_dir.mkdir(parents=True)
    loop = TrainingLoop(cfg, run_dir, closers, total_steps=4)
    loop.attach(model, None, optimizer, scheduler)
    steps: list[int] = []

    def step(n: int) -> dict[str, float]:
        steps.append(n)
        return {"reward/mean": float(n)}

    try:
        with loop.steps() as numbers:
            for n in numbers:
                loop.commit(step(n))
    finally:
        closers.close_all()
    assert steps == [1, 2, 3, 4]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_lines = [line for line in lines if "actor/lr" in line]
    assert [line["step"] for line in train_lines] == [1, 2, 3, 4]
    # the lr each step used: warmup 0.05, 0.1, then linear decay over the remaining 2 steps
    assert [line["actor/lr"] for line in train_lines] == pytest.approx([0.05, 0.1, 0.1, 0.05])
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000002", "step_000004"]


def test_rl_step_with_dynamic_sampling_refills_groups_without_signal(two_calls_conf: Path, tmp_path: Path) -> None:
    """TwoCalls always scores 0.25: every group has equal rewards, so each round is dropped and
    refilled until the cap, and the step trains on nothing."""
    from ajet.rl.recipe import train

    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true",
                                       "logging.tensorboard=false", "trainer.total_steps=1", "trainer.batch_size=1",
                                       "trainer.val_every=0", "trainer.save_final_model=false",
                                       "rollout.dynamic_sampling.enabled=true",
                                       "rollout.dynamic_sampling.max_rounds=3"])
    run_dir = train(cfg)
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["dynamic/rounds"] == 3 and row["dynamic/kept_groups"] == 0
    assert row["dynamic/dropped_groups"] == row["dynamic/tasks"] == 3
    assert row["actor/skipped_update"] == 1.0


def test_rl_run_stops_after_max_failed_steps_of_only_failed_episodes(two_calls_conf: Path, tmp_path: Path) -> None:
    from ajet.errors import AllEpisodesFailedError
    from ajet.rl.recipe import train

    (two_calls_conf.parent / "agent.py").write_text(
        "from ajet import Workflow\n\n\nclass TwoCalls(Workflow):\n"
        "    async def execute(self, task, tuner):\n        raise RuntimeError('the agent server is down')\n")
    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true",
                                       "logging.tensorboard=false", "trainer.total_steps=5", "trainer.val_every=0",
                                       "rollout.max_failed_steps=2", "rollout.max_retries=0"])
    with pytest.raises(AllEpisodesFailedError, match="2 consecutive steps") as info:
        train(cfg)
    assert "the agent server is down" in str(info.value) and info.value.exit_code == 2
    run_dir = run_dir_of(cfg)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # both failed steps are logged before the run stops


def test_max_minutes_ends_the_run_and_exports_fall_at_their_minutes(
        two_calls_conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.max_minutes stops after the step that ends past it (then the usual end: a last
    checkpoint and final_model); each trainer.export_at_minutes mark writes exports/min_<M>
    once, after the first step that ends past it. A fake clock: each step takes 2 minutes."""
    import torch

    from ajet.training import loop as loop_module
    from ajet.training.optim import build_optimizer

    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true",
                                       "trainer.total_steps=10", "trainer.val_every=0", "trainer.max_minutes=5",
                                       "trainer.export_at_minutes=[4,3,9]"])
    now = [0.0]
    monkeypatch.setattr(loop_module.time, "monotonic", lambda: now[0])
    saved: list[tuple[int, str]] = []
    monkeypatch.setattr(loop_module, "save_final_model",
                        lambda model, tokenizer, out, **kw: saved.append((loop.step, Path(out).name)))
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = build_optimizer(model, cfg.trainer)
    closers = Closers()
    run_dir = tmp_path / "exp" / cfg.project.name
    run_dir.mkdir(parents=True)
    loop = loop_module.TrainingLoop(cfg, run_dir, closers, total_steps=cfg.trainer.total_steps)
    loop.attach(model, None, optimizer, scheduler)
    steps: list[int] = []

    def step(n: int) -> dict[str, float]:
        steps.append(n)
        now[0] += 120.0
        return {"reward/mean": 0.0}

    try:
        with loop.steps() as numbers:
            for n in numbers:
                loop.commit(step(n))
    finally:
        closers.close_all()
    assert steps == [1, 2, 3]  # 6 minutes after step 3 >= 5
    # 3 and 4 both passed during step 2; 9 never came; then the final model
    assert saved == [(2, "min_3"), (2, "min_4"), (3, "final_model")]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000003"]


def test_export_marks_must_be_positive_minutes(two_calls_conf: Path) -> None:
    from ajet.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.export_at_minutes.*minutes > 0"):
        load_config(two_calls_conf, ["trainer.export_at_minutes=[5,0]"])
    with pytest.raises(ConfigError, match=r"trainer.max_minutes"):
        load_config(two_calls_conf, ["trainer.max_minutes=-1"])
