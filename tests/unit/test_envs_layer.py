"""The environment layer (ajet/envs, issue 73): `env:` in a YAML stands for the task file and the
workflow; the splits come from disjoint seeds; a bad section fails at load, naming the key."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from ajet.config import ConfigError, load_config
from ajet.config.schema import SPLIT_SEED_STRIDE, EnvConfig, EnvType, ReaderType, TaskReaderConfig
from ajet.envs import EnvAdapter, adapter, make_env_tasks, splits
from ajet.envs.base import import_optional, unknown_id
from ajet.errors import SetupError, TaskReaderError
from ajet.task_reader import build_reader
from ajet.workflow import Workflow, WorkflowTask


def test_env_type_stands_for_the_task_file_and_the_workflow() -> None:
    cfg = load_config(None, ["env.type=reasoning_gym", "env.id=basic_arithmetic"])
    assert cfg.task_reader.type == ReaderType.env
    assert cfg.workflow.target == "ajet.envs.reasoning_gym:EnvWorkflow"
    gym = load_config(None, ["env.type=gymnasium", "env.id=FrozenLake-v1"])
    assert gym.workflow.target == "ajet.envs.gymnasium:EnvWorkflow"


def test_a_workflow_of_your_own_is_kept(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("from ajet import Workflow\n\n\nclass Mine(Workflow):\n    pass\n")
    conf = tmp_path / "run.yaml"
    conf.write_text("env: {type: gymnasium, id: Taxi-v4}\nworkflow: {target: mine.py:Mine}\n")
    cfg = load_config(conf)
    assert cfg.workflow.target == f"{tmp_path / 'mine.py'}:Mine"
    assert cfg.task_reader.type == ReaderType.env


@pytest.mark.parametrize(("overrides", "key", "says"), [
    (["env.type=reasoning_gym"], "env.id", "dataset name"),
    (["env.type=gymnasium"], "env.id", "environment id"),
    (["env.type=gymnasium", "env.id=Taxi-v4", "task_reader.type=hf_dataset",
      "task_reader.hf_dataset.path=."], "task_reader.type", "the environment gives the tasks"),
    (["task_reader.type=env", "workflow.target=x:Y"], "task_reader.type", "needs env.type"),
    (["env.type=gymnasium", "env.id=Taxi-v4", "env.gymnasium.renderer=nofunction"],
     "env.gymnasium.renderer", "must be 'package.module:function'"),
    (["env.type=chess", "env.id=x"], "env.type", "reasoning_gym"),
    (["env.type=gymnasium", "env.id=Taxi-v4", f"env.val_size={SPLIT_SEED_STRIDE}"], "env.val_size", "must be"),
])
def test_a_bad_env_section_fails_at_load_naming_the_key(overrides: list[str], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert key in str(err.value) and says in str(err.value)


def test_splits_come_from_disjoint_seeds() -> None:
    train, val, test = splits(EnvConfig(type=EnvType.gymnasium, id="x", train_size=5, val_size=3, test_size=2, seed=7))
    assert [(s.name, s.seed, s.size) for s in (train, val, test)] == [
        ("train", 7, 5), ("val", 7 + SPLIT_SEED_STRIDE, 3), ("test", 7 + 2 * SPLIT_SEED_STRIDE, 2)]
    seeds = [set(range(s.seed, s.seed + s.size)) for s in (train, val, test)]
    assert not (seeds[0] & seeds[1] or seeds[0] & seeds[2] or seeds[1] & seeds[2])


class _Echo(Workflow):
    pass


def _fake_adapter() -> types.ModuleType:
    """An adapter module as ajet.envs.<type> is one: make_tasks and EnvWorkflow."""
    module = types.ModuleType("fake_adapter")

    def make_tasks(cfg: EnvConfig, parts: list) -> list[list[WorkflowTask]]:
        return [[WorkflowTask(task_id=f"{s.name}-{s.seed + k}", metadata={"env": {"seed": s.seed + k}})
                 for k in range(s.size)] for s in parts]

    module.make_tasks = make_tasks  # type: ignore[attr-defined]
    module.EnvWorkflow = _Echo  # type: ignore[attr-defined]
    return module


def test_the_reader_hands_out_the_adapters_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ajet.envs.gymnasium", _fake_adapter())
    env = EnvConfig(type=EnvType.gymnasium, id="x", train_size=3, val_size=2, test_size=1)
    found: EnvAdapter = adapter(EnvType.gymnasium)
    assert found.EnvWorkflow is _Echo
    reader = build_reader(TaskReaderConfig(type=ReaderType.env), seed=0, env=env)
    assert sorted(t.task_id for t in reader.train_tasks()) == ["train-0", "train-1", "train-2"]
    assert [t.task_id for t in reader.val_tasks()] == [f"val-{SPLIT_SEED_STRIDE}", f"val-{SPLIT_SEED_STRIDE + 1}"]
    assert [t.task_id for t in reader.test_tasks()] == [f"test-{2 * SPLIT_SEED_STRIDE}"]
    with pytest.raises(TaskReaderError, match="pass the config's env section"):
        build_reader(TaskReaderConfig(type=ReaderType.env), seed=0)
    with pytest.raises(TaskReaderError, match="gave no train task"):
        make_env_tasks(EnvConfig(type=EnvType.gymnasium, id="x", train_size=0))


def test_a_missing_package_names_the_extra_and_an_unknown_id_the_installed() -> None:
    with pytest.raises(SetupError, match=r"pip install 'ajet\[envs\]'"):
        import_optional("no_such_env_package_73", "no-such-env-package")
    message = str(unknown_id("dataset", "basic_arithmetc", ["chain_sum", "basic_arithmetic"]))
    assert "Did you mean basic_arithmetic?" in message and "Installed (2): basic_arithmetic, chain_sum" in message
