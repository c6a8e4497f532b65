"""Config loading: defaults, YAML merge, overrides, and the errors users see."""

from __future__ import annotations

from pathlib import Path

import pytest

from ajet.config import AjetConfig, ConfigError, defaults_yaml, load_config

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture()
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n')
    return path


def minimal(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "agent.py").write_text("class W: pass\n")
    (tmp_path / "train.jsonl").write_text('{"question": "1+1?"}\n')
    return write(
        tmp_path,
        "workflow:\n  target: agent.py:W\n"
        "task_reader:\n  jsonl:\n    train_path: train.jsonl\n" + extra,
    )


def test_shipped_default_yaml_matches_schema() -> None:
    shipped = (REPO / "configs" / "default.yaml").read_text()
    assert shipped == defaults_yaml(), "regenerate: ajet config --defaults > configs/default.yaml"


def test_yaml_merges_over_defaults_and_paths_resolve_relative_to_yaml(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "rollout:\n  n: 8\n")
    cfg = load_config(conf)
    assert isinstance(cfg, AjetConfig)
    assert cfg.rollout.n == 8
    assert cfg.rollout.max_tokens == AjetConfig().rollout.max_tokens  # untouched default
    assert cfg.workflow.target == f"{(tmp_path / 'agent.py').resolve()}:W"
    assert cfg.task_reader.jsonl.train_path == str((tmp_path / "train.jsonl").resolve())


def test_cli_overrides_win_over_yaml(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "trainer:\n  total_steps: 3\n")
    cfg = load_config(conf, ["trainer.total_steps=7", "algorithm.name=rloo"])
    assert cfg.trainer.total_steps == 7
    assert cfg.algorithm.name == "rloo"


def test_unknown_key_names_path_file_and_valid_keys(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "rollout:\n  nn: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf)
    msg = str(err.value)
    assert "rollout.nn" in msg and str(conf) in msg
    assert "Did you mean 'rollout.n'" in msg
    assert "max_concurrency" in msg  # lists the valid keys


@pytest.mark.parametrize(("section", "key", "replacement"), [
    ("rollout", "forced_call_schema_key", "rollout.tool_call_grammar"),
    ("sft", "lr", "trainer.lr"),
])
def test_a_removed_key_names_its_replacement(tmp_path: Path, section: str, key: str, replacement: str) -> None:
    conf = minimal(tmp_path, f"{section}:\n  {key}: true\n")
    with pytest.raises(ConfigError, match=rf"{conf}: '{section}.{key}' was removed; use {replacement} instead"):
        load_config(conf)
    with pytest.raises(ConfigError, match=rf"overrides: '{section}.{key}' was removed; use {replacement} instead"):
        load_config(minimal(tmp_path), [f"{section}.{key}=1"])


def test_unknown_top_level_section(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "trainr:\n  lr: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'trainr'.*trainer"):
        load_config(conf)


def test_wrong_type_names_key_and_expected_type(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "trainer:\n  total_steps: ten\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf)
    assert "trainer.total_steps" in str(err.value) and "Expected int" in str(err.value)


def test_wrong_enum_value_lists_choices(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "algorithm:\n  name: ppo2\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf)
    assert "algorithm.name" in str(err.value) and "grpo" in str(err.value)


def test_wrong_type_in_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="command-line overrides: rollout.n"):
        load_config(minimal(tmp_path), ["rollout.n=many"])


def test_empty_override_of_a_string_says_how_to_write_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(minimal(tmp_path), ["rollout.first_call_tool_choice="])
    assert "rollout.first_call_tool_choice" in str(err.value)
    assert '\'rollout.first_call_tool_choice=""\'' in str(err.value)
    cfg = load_config(minimal(tmp_path), ['rollout.first_call_tool_choice=""'])
    assert cfg.rollout.first_call_tool_choice == ""


def test_override_without_equals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not KEY=VALUE"):
        load_config(minimal(tmp_path), ["rollout.n"])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_bad_yaml_names_line(tmp_path: Path) -> None:
    conf = write(tmp_path, "trainer:\n  lr: [1\n")
    with pytest.raises(ConfigError, match=r"run.yaml:\d+:\d+: not valid YAML"):
        load_config(conf)


def test_impossible_combination_grpo_needs_a_group(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "rollout:\n  n: 1\n")
    with pytest.raises(ConfigError, match="rollout.n: grpo compares episodes"):
        load_config(conf)
    # the same setting is fine for an algorithm without groups
    cfg = load_config(conf, ["algorithm.name=reinforce_pp"])
    assert cfg.rollout.n == 1


def test_impossible_combination_lora_base_reference_needs_lora(tmp_path: Path) -> None:
    conf = minimal(tmp_path, "algorithm:\n  kl_coef: 0.1\n  kl_reference: lora_base\n")
    with pytest.raises(ConfigError, match="model.lora.enabled"):
        load_config(conf)
    assert load_config(conf, ["model.lora.enabled=true"]).model.lora.enabled


def test_missing_data_file_names_key(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("")
    conf = write(tmp_path, "workflow:\n  target: agent.py:W\ntask_reader:\n  jsonl:\n    train_path: gone.jsonl\n")
    with pytest.raises(ConfigError, match="task_reader.jsonl.train_path: file not found"):
        load_config(conf)


def test_workflow_target_required_for_training(tmp_path: Path) -> None:
    conf = write(tmp_path, "rollout:\n  n: 2\n")
    with pytest.raises(ConfigError, match="workflow.target: required"):
        load_config(conf)
    assert load_config(conf, require_workflow=False).rollout.n == 2


@pytest.mark.parametrize("name", ["/etc/x", "../../x", ".", "a/../../b", "", "a//b", "~/x"])
def test_a_project_name_that_leaves_the_experiments_root_is_refused(tmp_path: Path, name: str) -> None:
    """Before (issue 53): `/etc/x` wrote to /etc/x, `../../x` climbed out of project.exp_dir, and
    `.` made exp_dir itself the run directory, which `--fresh` then renamed aside whole."""
    conf = tmp_path / "c.yaml"
    conf.write_text("model: {path: m}\nworkflow: {target: a.py:W}\ntask_reader: {jsonl: {train_path: t.jsonl}}\n")
    with pytest.raises(ConfigError, match=r"project\.name"):
        load_config(conf, [f"project.name='{name}'"], require_workflow=False)


def test_a_project_name_may_have_sub_directories(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("model: {path: m}\ntask_reader: {jsonl: {train_path: t.jsonl}}\n")
    (tmp_path / "t.jsonl").write_text('{"task_id": "a", "question": "q"}\n')
    assert load_config(conf, ["project.name=math/run-1_a"], require_workflow=False).project.name == "math/run-1_a"


@pytest.mark.parametrize("value, says", [("${oc.env:AJET_SURELY_UNSET_VAR}", "AJET_SURELY_UNSET_VAR"),
                                          ("${trainer.no_such_key}", "trainer.no_such_key")])
def test_an_interpolation_that_cannot_resolve_is_a_config_error_naming_key_and_file(
        tmp_path: Path, value: str, says: str) -> None:
    """Before (issue 53): OmegaConf's InterpolationResolutionError came out raw."""
    conf = tmp_path / "c.yaml"
    conf.write_text(f'model: {{path: "{value}"}}\n')
    with pytest.raises(ConfigError) as info:
        load_config(conf, require_workflow=False)
    assert "model.path" in str(info.value) and str(conf) in str(info.value) and says in str(info.value)


def test_deterministic_needs_one_request_at_a_time_and_no_overlap_and_seeds_every_call(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("model: {path: m}\ntask_reader: {jsonl: {train_path: t.jsonl}}\n")
    (tmp_path / "t.jsonl").write_text('{"task_id": "a", "question": "q"}\n')
    with pytest.raises(ConfigError, match=r"rollout.max_concurrency.*trainer.deterministic"):
        load_config(conf, ["trainer.deterministic=true"], require_workflow=False)
    cfg = load_config(conf, ["trainer.deterministic=true", "rollout.max_concurrency=1", "project.seed=7"],
                      require_workflow=False)
    assert cfg.rollout.seed == 7
    assert load_config(conf, require_workflow=False).rollout.seed is None
