"""Config of the staged pipeline: sft/dpo/eval sections, stage checks, per-stage overrides, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.config import ConfigError, load_config
from ajet.config.validate import single_stage_config
from ajet.pipeline import stage_config

DIALOG = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}


def write(tmp_path: Path, body: str, *, workflow: bool = True) -> Path:
    (tmp_path / "dialogs.jsonl").write_text(json.dumps(DIALOG) + "\n")
    (tmp_path / "train.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    (tmp_path / "agent.py").write_text("async def fn(task: dict, model) -> float:\n    return 1.0\n")
    head = "workflow:\n  target: agent.py:fn\ntask_reader:\n  jsonl:\n    train_path: train.jsonl\n" if workflow else ""
    path = tmp_path / "run.yaml"
    path.write_text(head + body)
    return path


def test_sft_alone_needs_no_workflow_but_dialogs(tmp_path: Path) -> None:
    conf = write(tmp_path, "algorithm:\n  name: sft\nsft:\n  train_path: dialogs.jsonl\n", workflow=False)
    cfg = load_config(conf)
    assert cfg.algorithm.name == "sft"
    assert cfg.sft.train_path == str((tmp_path / "dialogs.jsonl").resolve())  # relative to the YAML
    with pytest.raises(ConfigError, match="sft.train_path: required for the sft stage"):
        load_config(write(tmp_path, "algorithm:\n  name: sft\n", workflow=False))
    with pytest.raises(ConfigError, match="sft.train_path: file not found"):
        load_config(conf, ["sft.train_path=missing.jsonl"])
    # any other stage runs the workflow
    with pytest.raises(ConfigError, match="workflow.target"):
        load_config(conf, ["pipeline.stages=[sft,eval]"])


@pytest.mark.parametrize(("override", "message"), [
    ("sft.replay.ratio=0.3", "sft.replay.buffer_size: replay.ratio > 0 needs a buffer_size > 0"),
    ("sft.coreset.hybrid_alpha=2", "sft.coreset.hybrid_alpha: must be in [0, 1]"),
    ("sft.task_weights.math=-1", "sft.task_weights: weights must be >= 0"),
    ("sft.coreset.strategy=kmeans", "sft.coreset.strategy"),
])
def test_sft_settings_are_checked(tmp_path: Path, override: str, message: str) -> None:
    conf = write(tmp_path, "algorithm:\n  name: sft\nsft:\n  train_path: dialogs.jsonl\n", workflow=False)
    with pytest.raises(ConfigError) as err:
        load_config(conf, [override])
    assert message in str(err.value)


def test_replay_needs_rounds(tmp_path: Path) -> None:
    conf = write(tmp_path, "algorithm:\n  name: sft\nsft:\n  train_path: dialogs.jsonl\n", workflow=False)
    with pytest.raises(ConfigError, match="set sft.rounds >= 2"):
        load_config(conf, ["sft.replay.ratio=0.3", "sft.replay.buffer_size=8"])
    cfg = load_config(conf, ["sft.replay.ratio=0.3", "sft.replay.buffer_size=8", "sft.rounds=3"])
    assert cfg.sft.replay.ratio == 0.3


def test_dpo_and_eval_checks(tmp_path: Path) -> None:
    conf = write(tmp_path, "")
    with pytest.raises(ConfigError, match="rollout.n: dpo pairs the best and worst"):
        load_config(conf, ["algorithm.name=dpo", "rollout.n=1"])
    with pytest.raises(ConfigError, match="'lora_base' needs model.lora.enabled"):
        load_config(conf, ["algorithm.name=dpo", "algorithm.dpo_reference=lora_base"])
    # eval.split is an enum in the schema: the loader names the key and the valid values.
    with pytest.raises(ConfigError, match=r"eval.split: Invalid value 'tset', expected one of \[val, train, test\]"):
        load_config(conf, ["pipeline.stages=[eval]", "eval.split=tset"])


def test_pipeline_stages_and_overrides_are_checked(tmp_path: Path) -> None:
    conf = write(tmp_path, "sft:\n  train_path: dialogs.jsonl\n")
    with pytest.raises(ConfigError, match=r"pipeline.stages\[0\]: Invalid value 'sftt', expected one of \[sft, dpo"):
        load_config(conf, ["pipeline.stages=[sftt,eval]"])
    with pytest.raises(ConfigError, match="pipeline.overrides.grpo: no stage named 'grpo'"):
        load_config(conf, ["pipeline.stages=[sft,eval]", "pipeline.overrides.grpo.trainer.lr=0.1"])
    with pytest.raises(ConfigError, match="pipeline.overrides.sft: sft.lrr"):
        load_config(conf, ["pipeline.stages=[sft,eval]", "pipeline.overrides.sft.sft.lrr=0.1"])
    # a stage's override is checked as that stage's config
    with pytest.raises(ConfigError, match="pipeline.overrides.dpo -> dpo pairs"):
        load_config(conf, ["pipeline.stages=[sft,dpo]", "pipeline.overrides.dpo.rollout.n=1"])


def test_stage_config_applies_override_algorithm_model_and_run_dir(tmp_path: Path) -> None:
    conf = write(tmp_path, "project:\n  name: pipe\nsft:\n  train_path: dialogs.jsonl\n"
                           "pipeline:\n  stages: [sft, grpo, eval]\n"
                           "  overrides:\n    grpo: {trainer: {lr: 0.5}, rollout: {n: 3}}\n")
    cfg = load_config(conf)
    grpo = stage_config(cfg, "grpo", 2, "/models/sft")
    assert grpo.algorithm.name == "grpo" and grpo.trainer.lr == 0.5 and grpo.rollout.n == 3
    assert grpo.model.path == "/models/sft" and grpo.project.name == "pipe/stages/02_grpo"
    assert grpo.trainer.save_final_model
    sft = single_stage_config(cfg, "sft")
    assert sft.algorithm.name == "sft" and sft.trainer.lr == cfg.trainer.lr
    assert sft.pipeline.stages == ["sft"] and sft.project.name == "pipe"
    ev = stage_config(cfg, "eval", 3, "/models/grpo")
    assert ev.algorithm.name == cfg.algorithm.name and ev.model.path == "/models/grpo"
    # default_model="initial" stays the model the pipeline started from after a training stage
    assert grpo.model.initial_path == ev.model.initial_path == cfg.model.path
    assert stage_config(cfg, "sft", 1, cfg.model.path).model.initial_path == ""  # its own weights
    cfg.model.initial_path = "/models/opponent"  # the user's choice wins
    assert stage_config(cfg, "grpo", 2, "/models/sft").model.initial_path == "/models/opponent"


def test_cli_sft_and_eval_report_bad_input_without_traceback(tmp_path: Path) -> None:
    from ajet.cli import eval as eval_cmd
    from ajet.cli import sft as sft_cmd

    runner = CliRunner()
    conf = write(tmp_path, "sft:\n  epochs: 1\n", workflow=False)
    result = runner.invoke(sft_cmd.app, ["--conf", str(conf)])
    assert result.exit_code == 2 and "sft.train_path" in result.output and "Traceback" not in result.output
    result = runner.invoke(eval_cmd.app, ["--conf", str(conf), "--split", "tset"])
    assert result.exit_code == 2 and "eval.split" in result.output and "Traceback" not in result.output
    # Every problem the checks find is reported at once (ranges are checked at load time,
    # whichever stages run).
    result = runner.invoke(eval_cmd.app, ["--conf", str(conf), "eval.n=0", "rollout.top_p=0"])
    assert result.exit_code == 2 and "eval.n" in result.output and "rollout.top_p" in result.output


def test_help_lists_the_new_commands() -> None:
    from ajet.cli.main import commands_epilog

    epilog = commands_epilog()
    assert "ajet sft" in epilog and "ajet eval" in epilog


def test_debug_backbone_dispatches_sft_dpo_and_pipelines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ajet.backbones.debug as backbone
    import ajet.dpo.recipe
    import ajet.pipeline
    import ajet.sft.recipe
    from ajet.errors import UserError

    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(ajet.sft.recipe, "train_sft", lambda cfg, resume=False: calls.append(("sft", cfg)))
    monkeypatch.setattr(ajet.dpo.recipe, "train_dpo",
                        lambda cfg, resume=False, workflow=None: calls.append(("dpo", cfg)))
    monkeypatch.setattr(ajet.pipeline, "run_pipeline",
                        lambda cfg, runner, workflow=None, resume=False: calls.append(("pipeline", cfg)))
    conf = write(tmp_path, "sft:\n  train_path: dialogs.jsonl\n")
    def run(cfg: object, **kw: bool) -> None:
        ajet.pipeline.run(cfg, backbone, backbone="debug", **kw)

    run(load_config(conf, ["algorithm.name=sft"]), with_ray=False, resume=False)
    run(load_config(conf, ["algorithm.name=dpo"]), with_ray=False, resume=False)
    run(load_config(conf, ["pipeline.stages=[sft,grpo]"]), with_ray=False, resume=False)
    assert [name for name, _ in calls] == ["sft", "dpo", "pipeline"]
    assert calls[0][1].algorithm.name == "sft" and calls[1][1].algorithm.name == "dpo"
    with pytest.raises(UserError, match="--with-ray"):
        run(load_config(conf, ["algorithm.name=sft"]), with_ray=True, resume=False)


def test_a_null_stage_override_drops_the_yamls_override_for_that_stage(tmp_path: Path) -> None:
    conf = write(tmp_path, "sft:\n  train_path: dialogs.jsonl\n"
                           "pipeline:\n  stages: [sft, grpo, eval]\n"
                           "  overrides:\n    sft: {trainer: {lr: 0.5}}\n    grpo: {trainer: {lr: 0.25}}\n")
    # leaving the sft stage out: its override is an error that says how to drop it ...
    with pytest.raises(ConfigError, match=r"no stage named 'sft' .*pipeline.overrides.sft=null"):
        load_config(conf, ["pipeline.stages=[grpo,eval]"])
    # ... and dropping it runs the other stages with their own overrides
    cfg = load_config(conf, ["pipeline.stages=[grpo,eval]", "pipeline.overrides.sft=null"])
    assert stage_config(cfg, "grpo", 1, "/models/sft").trainer.lr == 0.25
    # a stage of the run whose override is null runs with the run's own config, checked as usual
    cfg = load_config(conf, ["pipeline.overrides.sft=null"])
    assert single_stage_config(cfg, "sft").trainer.lr == cfg.trainer.lr
    with pytest.raises(ConfigError, match="sft.train_path"):
        load_config(conf, ["pipeline.overrides.sft=null", "sft.train_path=''"])
