"""The reasoning-gym adapter (issue 73): a dataset by name gives each split's tasks from disjoint
seeds; the reward is the dataset's own score_answer on what extract_answer finds in the reply; a
bad dataset name, bad args or a scorer that fails is an error that says what, never a crash."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from ajet.config.schema import EnvConfig, EnvType, ReasoningGymEnvConfig, RolloutConfig
from ajet.envs import EnvError, make_env_tasks
from ajet.errors import TaskReaderError
from ajet.workflow import WorkflowTask

pytest.importorskip("reasoning_gym", reason="the envs extra: pip install 'ajet[envs]'")
from ajet.envs.reasoning_gym import EnvWorkflow, _dataset  # noqa: E402 - after the extra's check


def env(**kw: Any) -> EnvConfig:
    return EnvConfig(type=EnvType.reasoning_gym, **{"id": "basic_arithmetic", "train_size": 6, "val_size": 3,
                                                    "test_size": 3, **kw})


def scripted(*replies: str) -> Any:
    """A tuner that answers each call with the next reply (and remembers the messages)."""
    seen: list[list[dict]] = []
    it = iter(replies)

    async def tuner(messages: list[dict]) -> SimpleNamespace:
        seen.append(list(messages))
        return SimpleNamespace(content=[{"type": "text", "text": next(it)}])

    tuner.seen = seen  # type: ignore[attr-defined]
    return tuner


def play(task: WorkflowTask, reply: str) -> Any:
    return asyncio.run(EnvWorkflow().execute(task, scripted(reply)))


def test_each_split_is_its_own_seed_and_the_item_is_what_the_task_says() -> None:
    train, val, test = make_env_tasks(env(args={"min_terms": 2, "max_terms": 3}))
    assert [len(train), len(val), len(test)] == [6, 3, 3]
    specs = [t.metadata["env"] for t in (*train, *val, *test)]
    assert len({s["seed"] for s in specs}) == 3  # one seed per split: train 0, val 1e6, test 2e6
    assert len({(s["seed"] + s["index"]) for s in specs}) == 12  # items' own seeds never shared
    assert not {t.main_query for t in train} & {t.main_query for t in (*val, *test)}
    first = train[0]
    assert first.task_id == "basic_arithmetic-train-0" and first.env_type == "reasoning_gym"
    assert first.init_messages[0]["role"] == "system" and "<answer>" in first.init_messages[0]["content"]
    assert first.init_messages[1] == {"role": "user", "content": first.main_query}
    assert first.metadata["num_terms"] in (2, 3)  # the item's numbers: a curriculum key
    again = make_env_tasks(env(args={"min_terms": 2, "max_terms": 3}))[0]
    assert [t.model_dump() for t in again] == [t.model_dump() for t in train]  # deterministic


def test_a_val_question_that_is_a_train_question_is_left_out() -> None:
    # 1-digit, 2-term sums: few distinct questions, so some val items repeat a train one.
    train, val, _ = make_env_tasks(env(id="chain_sum", train_size=60, val_size=20, test_size=0,
                                       args={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}))
    assert len(val) < 20 and not {t.main_query for t in train} & {t.main_query for t in val}


def test_the_datasets_scorer_is_the_reward() -> None:
    task = make_env_tasks(env())[0][0]
    answer = task.metadata["answer"]
    right = play(task, f"Let me think. <answer>{answer}</answer>")
    assert (right.reward, right.is_success, right.metadata["final_answer"]) == (1.0, True, answer)
    assert right.log_metrics == {"score": 1.0, "answer_tagged": 1.0}
    wrong = play(task, "<answer>123456789</answer>")
    assert (wrong.reward, wrong.is_success) == (0.0, False)
    untagged = play(task, answer)  # no <answer> tag: reasoning-gym's rule, the format counts
    assert untagged.reward == 0.0 and untagged.log_metrics["answer_tagged"] == 0.0
    lenient = make_env_tasks(env(reasoning_gym=ReasoningGymEnvConfig(score_untagged_reply=True)))[0][0]
    assert play(lenient, f"  {answer} ").reward == 1.0


def test_the_system_prompt_is_named_or_given() -> None:
    direct = make_env_tasks(env(reasoning_gym=ReasoningGymEnvConfig(system_prompt="direct")))[0][0]
    assert direct.init_messages[0]["content"].startswith("Answer the question directly.")
    own = make_env_tasks(env(reasoning_gym=ReasoningGymEnvConfig(system_prompt="Be brief.")))[0][0]
    assert own.init_messages[0]["content"] == "Be brief."


def test_an_unknown_dataset_lists_the_installed_ones_and_bad_args_the_fields() -> None:
    with pytest.raises(TaskReaderError, match=r"Did you mean basic_arithmetic.*Installed \(\d+\): ab, acre"):
        make_env_tasks(env(id="basic_arithmetc"))
    with pytest.raises(TaskReaderError, match=r"env.args=\{'max_term': 3\}.*fields: min_terms, max_terms"):
        make_env_tasks(env(args={"max_term": 3}))


def test_a_task_the_dataset_does_not_make_again_is_an_env_error() -> None:
    task = make_env_tasks(env())[0][0]
    other = task.model_copy(update={"main_query": "What is 1 + 1?"})
    with pytest.raises(EnvError, match="another reasoning-gym version"):
        play(other, "<answer>2</answer>")


# ------------------------------------------------------------------ through the rollout runner


@dataclass
class _Tracker:
    calls: list = field(default_factory=list)

    def timelines(self) -> list:
        return []

    def stats(self) -> dict:
        return {}


@dataclass
class _Handle:
    tuner: Any
    tracker: _Tracker = field(default_factory=_Tracker)

    def close(self) -> None:
        pass


def run_episode(workflow: Any, task: WorkflowTask, tuner: Any) -> Any:
    """One episode through ajet's TaskRunner (as training runs it), with a scripted model."""
    from ajet.rollout.runner import TaskRunner

    class Factory:
        def open_episode(self, episode_id: str, task: WorkflowTask) -> _Handle:
            return _Handle(tuner)

    runner = TaskRunner(workflow, None, Factory(), RolloutConfig(episode_timeout_s=30))
    return asyncio.run(runner.run_episode(task, "e0", "g0"))


def test_a_scorer_that_raises_fails_the_episode_not_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    task = make_env_tasks(env())[0][0]
    spec = task.metadata["env"]
    import json

    dataset = _dataset(spec["id"], json.dumps(spec["args"], sort_keys=True), spec["seed"], spec["size"])

    def broken(answer: str | None, entry: dict) -> float:
        raise KeyError("oracle")

    monkeypatch.setattr(dataset, "score_answer", broken)
    episode = run_episode(EnvWorkflow(), task, scripted("<answer>1</answer>"))
    assert (episode.status, episode.reason) == ("failed", "workflow_error:EnvError")
    assert "score_answer raised KeyError" in episode.error_message
    monkeypatch.setattr(dataset, "score_answer", lambda answer, entry: float("nan"))
    episode = run_episode(EnvWorkflow(), task, scripted("<answer>1</answer>"))
    assert episode.reason == "workflow_error:EnvError" and "not a finite number" in episode.error_message
    monkeypatch.undo()
    ok = run_episode(EnvWorkflow(), task, scripted(f"<answer>{task.metadata['answer']}</answer>"))
    assert (ok.status, ok.reward, ok.is_success) == ("ok", 1.0, True)


def test_the_datasets_curriculum_levels_become_ajets_curriculum() -> None:
    """env.reasoning_gym.curriculum_levels: each split's tasks come evenly from the curriculum's
    global levels (chain_sum: level L allows up to L + 2 terms of up to L + 1 digits), each task
    carries its `curriculum_level`, episodes regenerate their level's item, and ajet's curriculum
    draws level 0 first."""
    from ajet.task_reader import TaskReader
    from ajet.task_reader.curriculum import Curriculum

    cfg = env(id="chain_sum", train_size=30, val_size=6, test_size=6,
              reasoning_gym=ReasoningGymEnvConfig(curriculum_levels=3))
    train, val, test = make_env_tasks(cfg)
    assert [t.metadata["curriculum_level"] for t in train] == [0] * 10 + [1] * 10 + [2] * 10
    assert {t.metadata["curriculum_level"] for t in (*val, *test)} == {0, 1, 2}
    for task in train:
        level, args = task.metadata["curriculum_level"], task.metadata["env"]["args"]
        assert (args["min_terms"], args["max_terms"], args["min_digits"], args["max_digits"]) == (2, level + 2, 1,
                                                                                                   level + 1)
        terms = task.main_query.split(":")[1].strip(" =").split()[::2]
        assert len(terms) <= level + 2 and all(len(n.lstrip("-")) <= level + 1 for n in terms)
    assert max(len(t.main_query.split(":")[1].split()[::2]) for t in train[20:]) > 2  # level 2 has longer sums
    seeds = [(t.metadata["env"]["seed"], t.metadata["env"]["index"]) for t in train]
    assert len({s + i for s, i in seeds}) == 30  # no two tasks from one reasoning-gym seed
    hard = train[25]
    assert play(hard, f"<answer>{hard.metadata['answer']}</answer>").reward == 1.0  # the level's item, rebuilt
    reader = TaskReader(train, seed=0, curriculum=Curriculum(train, key="curriculum_level", start=0.3,
                                                             ramp_steps=4, seed=0))
    assert {t.metadata["curriculum_level"] for t in reader.next_batch(8, step=1)} == {0}


def test_curriculum_levels_for_a_dataset_without_one_or_past_its_top_say_what_is_valid() -> None:
    with pytest.raises(TaskReaderError, match=r"curriculum_levels=2: reasoning-gym's acre has no "
                                              r"curriculum; set it to 0, or use a dataset that has one \(\d+: "):
        make_env_tasks(env(id="acre", reasoning_gym=ReasoningGymEnvConfig(curriculum_levels=2)))
    with pytest.raises(TaskReaderError, match="chain_sum's curriculum has 11 levels"):
        make_env_tasks(env(id="chain_sum", reasoning_gym=ReasoningGymEnvConfig(curriculum_levels=40)))
