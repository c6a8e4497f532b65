"""Task selection (`task_reader.selection`): the epoch walk passes over tasks the policy lately
always or never solved, revisits them later, and resumes to the same draws."""

from __future__ import annotations

from ajet.backbones.registry import backbone_problems
from ajet.config.schema import AjetConfig, PassOver, TaskSelectionConfig
from ajet.config.validate import validate
from ajet.task_reader import TaskReader
from ajet.task_reader.selection import Outcome, TaskSelection
from ajet.workflow import WorkflowTask

TASKS = [WorkflowTask(task_id=f"t{i}", main_query=f"q{i}") for i in range(4)]


def reader(**selection: int) -> TaskReader:
    return TaskReader(TASKS, seed=0, shuffle=False, selection=TaskSelection(TaskSelectionConfig(enabled=True,
                                                                                              **selection)))


def step(r: TaskReader, n: int, passes: dict[str, list[bool]], at: int) -> tuple[list[str], dict[str, float]]:
    """Draw `n` tasks for step `at`, then observe each drawn task's episodes (`passes`, default a
    mixed group: one pass, one fail)."""
    batch = [t.task_id for t in r.next_batch(n, step=at)]
    outcomes = [Outcome(task, ok) for task in batch for ok in passes.get(task, [True, False])]
    return batch, r.observe(outcomes)


def test_a_settled_task_is_passed_over_and_a_mixed_one_is_not() -> None:
    r = reader(window=2, min_seen=2, revisit_epochs=3)
    always = {"t0": [True, True], "t1": [False, False]}
    assert step(r, 4, always, 1)[0] == ["t0", "t1", "t2", "t3"]  # epoch 0: one group each, not settled yet
    assert step(r, 4, always, 2)[0] == ["t0", "t1", "t2", "t3"]  # epoch 1: the second group settles t0, t1
    batch, metrics = step(r, 4, always, 3)
    assert batch == ["t2", "t3", "t2", "t3"]  # epochs 2 and 3 pass over t0 (always) and t1 (never)
    assert metrics["reader/selection_skipped"] == 4 and metrics["reader/settled_share"] == 0.5


def test_a_passed_over_task_is_revisited_and_a_changed_one_comes_back() -> None:
    r = reader(window=2, min_seen=2, revisit_epochs=2)
    for at in (1, 2):
        step(r, 4, {"t0": [True, True]}, at)  # t0 last drawn in epoch 1
    assert step(r, 3, {}, 3)[0] == ["t1", "t2", "t3"]  # epoch 2: passed over
    assert step(r, 4, {"t0": [True, False]}, 4)[0] == ["t0", "t1", "t2", "t3"]  # epoch 3 = 1 + 2: revisited
    assert step(r, 4, {}, 5)[0] == ["t0", "t1", "t2", "t3"]  # a mixed group unsettles it


def test_a_settled_train_set_is_still_drawn_from() -> None:
    r = reader(window=1, min_seen=1, revisit_epochs=100)
    step(r, 4, {t.task_id: [True] for t in TASKS}, 1)
    assert len(step(r, 2, {}, 2)[0]) == 2  # every task settled: the walk draws rather than spin


def test_resuming_from_a_step_draws_what_the_uninterrupted_run_drew() -> None:
    always = {"t0": [True, True], "t3": [False, False]}
    straight = reader(window=2, min_seen=2, revisit_epochs=2)
    drawn = [step(straight, 3, always, at)[0] for at in range(1, 7)]
    first = reader(window=2, min_seen=2, revisit_epochs=2)
    for at in range(1, 4):
        step(first, 3, always, at)
    saved = first.state_at_end_of(3)
    resumed = reader(window=2, min_seen=2, revisit_epochs=2)
    resumed.load_state_dict(saved)
    assert [step(resumed, 3, always, at)[0] for at in range(4, 7)] == drawn[3:]
    # The resumed part passes over settled tasks (not the plain walk t1 t2 t3 / t0 t1 t2 / t3 t0 t1):
    # the record came back with the state.
    assert drawn[3:] == [["t2", "t0", "t1"], ["t2", "t3", "t1"], ["t2", "t0", "t1"]]


def test_config_refuses_it_with_a_curriculum_and_on_the_gpu_backbones() -> None:
    cfg = AjetConfig()
    cfg.task_reader.selection.enabled = True
    cfg.task_reader.curriculum.key = "level"
    assert "task_reader.selection.enabled" in dict(validate(cfg, require_workflow=False))
    cfg.task_reader.curriculum.key = ""
    assert "task_reader.selection.enabled" not in dict(backbone_problems("debug", cfg))
    assert "runs on --backbone=debug or tinker only" in dict(backbone_problems("verl", cfg))["task_reader.selection.enabled"]


def test_the_rl_recipe_feeds_the_selection_and_logs_it(two_calls_conf, tmp_path) -> None:  # noqa: ANN001
    """TwoCalls scores 0.25 (never a success): after one group each task is settled, so epoch 1
    passes over every task (then draws one anyway) and says so in its metrics."""
    import json

    from ajet.config import load_config
    from ajet.rl.recipe import train

    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true",
                                       "logging.tensorboard=false", "trainer.total_steps=4", "trainer.batch_size=1",
                                       "trainer.val_every=0", "trainer.save_final_model=false",
                                       "task_reader.shuffle=false", "task_reader.selection.enabled=true",
                                       "task_reader.selection.window=1", "task_reader.selection.min_seen=1"])
    rows = [json.loads(line) for line in (train(cfg) / "metrics.jsonl").read_text().splitlines()]
    assert [row["reader/selection_skipped"] for row in rows] == [0, 0, 0, 3]
    assert [row["reader/settled_share"] for row in rows] == [1 / 3, 2 / 3, 1, 1]


def test_pass_over_names_which_settled_tasks_are_passed_over() -> None:
    always = {"t0": [True, True], "t1": [False, False]}
    for pass_over, drawn in (("solved", ["t1", "t2", "t3"]), ("failed", ["t0", "t2", "t3"])):
        r = TaskReader(TASKS, seed=0, shuffle=False, selection=TaskSelection(TaskSelectionConfig(
            enabled=True, window=1, min_seen=1, revisit_epochs=3, pass_over=PassOver(pass_over))))
        step(r, 4, always, 1)
        batch, metrics = step(r, 3, always, 2)
        assert batch == drawn  # only the settled task of its kind passed over (t0 always, t1 never solved)
        assert metrics["reader/selection_skipped"] == 1 and metrics["reader/settled_share"] == 0.25
