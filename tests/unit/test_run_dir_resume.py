"""Run-directory rules (issue 16 items 10-13): a new run refuses an earlier run's directory,
--resume refuses a missing one, a resumed run logs every step exactly once, and final_model/
is written atomically."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from ajet.config import load_config
from ajet.errors import UserError
from ajet.training.checkpoint import _COMPLETE
from ajet.training.recipe import Closers
from ajet.training.run_dir import prepare_run_dir, run_dir_of


@pytest.fixture()
def cfg(two_calls_conf: Path, tmp_path: Path):
    return load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true",
                                        "logging.tensorboard=false"])


def test_a_new_run_refuses_a_directory_with_metrics_but_no_checkpoint(cfg) -> None:
    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "split": "train"}\n')
    with pytest.raises(UserError, match=r"already holds metrics .*--resume") as info:
        prepare_run_dir(cfg, resume=False)
    assert info.value.exit_code == 2
    assert prepare_run_dir(cfg, resume=True) == run_dir


def test_resume_refuses_a_run_directory_that_does_not_exist(cfg) -> None:
    with pytest.raises(UserError, match="does not exist, so there is no run to continue") as info:
        prepare_run_dir(cfg, resume=True)
    assert info.value.exit_code == 2
    assert not run_dir_of(cfg).exists()


def fake_checkpoint(run_dir: Path, step: int) -> None:
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / _COMPLETE).write_text("")


def test_a_resumed_loop_drops_what_was_logged_past_its_checkpoint(cfg) -> None:
    from ajet.training.loop import TrainingLoop

    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True)
    lines = [{"step": s, "split": split} for s in range(1, 6) for split in ("train", "val")]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 6, "spl')
    (run_dir / "records").mkdir()
    for s in range(1, 6):
        (run_dir / "records" / f"step_{s:06d}.jsonl").write_text("{}\n")
    fake_checkpoint(run_dir, 3)  # killed while writing step 4's checkpoint: 4 and 5 come again
    closers = Closers()
    loop = TrainingLoop(cfg, run_dir, closers, total_steps=5, resume=True)
    loop.metrics.log(4, {"reward/mean": 1.0})
    closers.close_all()
    steps = [(r["step"], r["split"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]
    assert steps == [(1, "train"), (1, "val"), (2, "train"), (2, "val"), (3, "train"), (3, "val"), (4, "train")]
    assert sorted(p.name for p in (run_dir / "records").iterdir()) == [f"step_{s:06d}.jsonl" for s in (1, 2, 3)]


def test_resume_without_any_checkpoint_starts_over(cfg) -> None:
    from ajet.training.loop import TrainingLoop

    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "split": "val"}\n{"step": 1, "split": "train"}\n')
    closers = Closers()
    TrainingLoop(cfg, run_dir, closers, total_steps=5, resume=True)
    closers.close_all()
    assert (run_dir / "metrics.jsonl").read_text() == ""


class FakeModel:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "config.json").write_text("{}")
        (Path(path) / "model.safetensors").write_text("weights")


class FailingTokenizer:
    def save_pretrained(self, path: Path) -> None:
        raise OSError("disk full")


class Tokenizer:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


def test_final_model_is_written_atomically(tmp_path: Path) -> None:
    from ajet.training.model import save_final_model

    out = tmp_path / "run" / "final_model"
    with pytest.raises(OSError, match="disk full"):
        save_final_model(FakeModel(), FailingTokenizer(), out, lora=False)
    assert not out.exists() and list((tmp_path / "run").iterdir()) == []  # no half model, no temp dir
    save_final_model(FakeModel(), Tokenizer(), out, lora=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    with pytest.raises(OSError, match="disk full"):
        save_final_model(FakeModel(), FailingTokenizer(), out, lora=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["final_model"]


@pytest.mark.parametrize(("backbone", "checkpoints"), [("trinity", "trinity/global_step_3"),
                                                       ("verl", "verl/checkpoints/global_step_3")])
def test_the_gpu_backbones_keep_the_same_run_directory_rules(cfg, monkeypatch, backbone, checkpoints) -> None:
    """trinity and verl prepare their runs with `prepare_run_dir`: --resume of a missing directory
    is refused, and their own checkpoints count as an earlier run's."""
    driver = importlib.import_module(f"ajet.backbones.{backbone}.driver")
    monkeypatch.setattr(driver, "model_path_for", lambda cfg: ("/models/x", True))
    with pytest.raises(UserError, match="does not exist, so there is no run to continue"):
        driver.prepare(cfg, resume=True)
    assert not run_dir_of(cfg).exists()
    (run_dir_of(cfg) / checkpoints).mkdir(parents=True)
    with pytest.raises(UserError, match=r"already holds checkpoints .*--resume"):
        driver.prepare(cfg, resume=False)


def test_a_pipeline_refuses_an_earlier_pipeline_run_before_its_first_stage(cfg, monkeypatch) -> None:
    import ajet.backbones.debug
    import ajet.pipeline
    from ajet.training.run_dir import earlier_pipeline_run

    run_dir = run_dir_of(cfg)
    (run_dir / "eval").mkdir(parents=True)
    # `ajet eval --name`'s own reports are not a pipeline run's
    (run_dir / "eval" / "eval_teacher.json").write_text("{}")
    assert earlier_pipeline_run(run_dir) == ""
    report = run_dir / "eval" / "eval_01_base.json"
    report.write_text('{"earlier": 1}')
    assert "evaluations" in earlier_pipeline_run(run_dir)
    ran: list[str] = []
    monkeypatch.setattr(ajet.pipeline, "evaluate", lambda *a, **kw: ran.append("eval"))
    cfg.pipeline.stages = ["eval", "grpo"]
    with pytest.raises(UserError, match=r"already holds evaluations .*--resume.*--fresh"):
        ajet.pipeline.run_pipeline(cfg, ajet.backbones.debug)
    assert ran == [] and report.read_text() == '{"earlier": 1}'  # nothing ran, nothing overwritten


def test_move_aside_keeps_every_earlier_run_under_its_own_name(tmp_path: Path) -> None:
    from ajet.training.run_dir import move_aside

    run_dir = tmp_path / "demo"
    assert move_aside(run_dir) is None  # nothing there
    run_dir.mkdir()
    assert move_aside(run_dir) is None and run_dir.is_dir()  # empty: nothing to keep
    kept = []
    for n in range(2):  # twice within one second: two names
        run_dir.mkdir(exist_ok=True)
        (run_dir / "metrics.jsonl").write_text(f"{n}\n")
        kept.append(move_aside(run_dir))
        assert not run_dir.exists()
    assert kept[0] != kept[1] and all(p.name.startswith("demo.") for p in kept)
    assert [p.joinpath("metrics.jsonl").read_text() for p in kept] == ["0\n", "1\n"]


@pytest.mark.parametrize("last", [True, False])
def test_the_last_checkpoint_is_written_unless_turned_off(cfg, last: bool) -> None:
    """trainer.save_last_checkpoint=false ends a run with RUN/final_model alone (make demo)."""
    import dataclasses

    import torch

    from ajet.training.loop import TrainingLoop

    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, save_last_checkpoint=last))
    run_dir = prepare_run_dir(cfg, resume=False)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved: list[str] = []
    closers = Closers()
    loop = TrainingLoop(cfg, run_dir, closers, total_steps=2)
    loop.attach(model, Tokenizer(), optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0))
    loop.save_final_model = lambda out=None: saved.append("final_model")  # what it writes is tested above
    with loop.steps() as steps:
        for step in steps:
            loop.commit({"loss": float(step)})
    closers.close_all()
    assert saved == ["final_model"]
    assert loop.resume_step() == (2 if last else 0)


def test_a_run_that_would_save_nothing_is_refused(two_calls_conf: Path) -> None:
    from ajet.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.save_last_checkpoint: false with trainer.save_final_model=false"):
        load_config(two_calls_conf, ["trainer.save_last_checkpoint=false", "trainer.save_final_model=false"])


def test_a_run_directory_in_use_by_another_process_is_refused_with_its_pid(cfg) -> None:
    """Two runs in one directory interleaved metrics.jsonl and pruned each other's checkpoints.
    The lock goes with its process, SIGKILL included: then the directory is free again."""
    import subprocess
    import sys
    import time

    from ajet.training.run_dir import move_aside

    run_dir = run_dir_of(cfg)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from ajet.training.run_dir import lock_run_dir; "
        f"lock_run_dir(Path({str(run_dir)!r})); print('locked', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=rf"is in use by another run \(pid {holder.pid}: -c\)"):
            prepare_run_dir(cfg, resume=False)
        with pytest.raises(UserError, match="in use by another run"):  # --fresh does not move it away
            move_aside(run_dir)
        assert not (run_dir / "config.yaml").exists()  # nothing was written
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel frees the lock with the process
        try:
            assert prepare_run_dir(cfg, resume=False) == run_dir
            break
        except UserError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    prepare_run_dir(cfg, resume=True)  # this process holds it: again is fine


def test_resume_refuses_another_model_data_or_batch_shape_naming_each(cfg, two_calls_conf: Path) -> None:
    import dataclasses

    run_dir = prepare_run_dir(cfg, resume=False)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "split": "train"}\n')
    assert prepare_run_dir(cfg, resume=True) == run_dir  # the same config: fine
    Path(cfg.task_reader.jsonl.train_path).write_text('{"task_id": "other", "question": "q"}\n')
    changed = dataclasses.replace(
        cfg, trainer=dataclasses.replace(cfg.trainer, batch_size=cfg.trainer.batch_size + 1, total_steps=99),
        model=dataclasses.replace(cfg.model, path="/elsewhere/model"))
    config_before = (run_dir / "config.yaml").read_text()
    with pytest.raises(UserError) as refused:
        prepare_run_dir(changed, resume=True)
    message = str(refused.value)
    assert "model.path: " in message and "'/elsewhere/model' now" in message
    assert f"trainer.batch_size: {cfg.trainer.batch_size} in the run, {cfg.trainer.batch_size + 1} now" in message
    assert "task_reader.jsonl.train_path (sha256)" in message and "--resume-changed" in message
    assert "total_steps" not in message  # more steps is what --resume is for
    assert (run_dir / "config.yaml").read_text() == config_before  # nothing changed
    anyway = dataclasses.replace(changed, project=dataclasses.replace(changed.project, resume_changed=True))
    assert prepare_run_dir(anyway, resume=True) == run_dir
    assert prepare_run_dir(changed, resume=True) == run_dir  # the run now continues with these


def test_the_cli_takes_resume_changed(two_calls_conf: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ajet.cli.train import app

    args = ["--conf", str(two_calls_conf), "--exp-dir", str(tmp_path / "exp"), "--quiet"]
    first = CliRunner().invoke(app, [*args, "trainer.total_steps=1", "trainer.save_final_model=false"])
    assert first.exit_code == 0, first.output
    refused = CliRunner().invoke(app, [*args, "--resume", "trainer.total_steps=2", "trainer.batch_size=3"])
    assert refused.exit_code != 0 and "trainer.batch_size: " in refused.output and ", 3 now" in refused.output, refused.output
    assert "--resume-changed" in refused.output
    anyway = CliRunner().invoke(app, [*args, "--resume-changed", "trainer.total_steps=2", "trainer.batch_size=3"])
    assert anyway.exit_code == 0, anyway.output


def test_a_run_directory_is_owner_only_and_its_config_keeps_secrets_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before (issue 53): RUN/config.yaml was world-readable and held serve.client_token and
    every resolved ${oc.env:...} secret; the same YAML went to wandb/swanlab."""
    import os
    import stat

    from ajet.config import load_config, to_yaml
    from ajet.training.run_dir import prepare_run_dir

    monkeypatch.setenv("AJET_TEST_SECRET", "sk-very-secret-value-123")
    conf = tmp_path / "c.yaml"
    (tmp_path / "t.jsonl").write_text('{"task_id": "a", "question": "q"}\n')
    conf.write_text(f"project: {{name: p, exp_dir: {tmp_path / 'exp'}}}\nmodel: {{path: m}}\n"
                    "task_reader: {jsonl: {train_path: t.jsonl}, env_service: {base_url: '${oc.env:AJET_TEST_SECRET}'}}\n"
                    "serve: {client_token: my-client-token-456}\n")
    old = os.umask(0o022)
    try:
        cfg = load_config(conf, require_workflow=False)
        assert cfg.task_reader.env_service.base_url == "sk-very-secret-value-123"  # the run gets the value
        run_dir = prepare_run_dir(cfg, resume=False)
    finally:
        os.umask(old)
    saved = (run_dir / "config.yaml").read_text()
    assert "sk-very-secret-value-123" not in saved and "${oc.env:AJET_TEST_SECRET}" in saved
    assert "my-client-token-456" not in saved and "client_token: <redacted>" in saved
    assert to_yaml(cfg) == saved  # what --dry-run prints and the metrics sinks upload
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "config.yaml").stat().st_mode) == 0o600
    # a run loading the saved config (a GPU backbone's plugin) resolves the variable again
    assert load_config(run_dir / "config.yaml", require_workflow=False).task_reader.env_service.base_url == (
        "sk-very-secret-value-123")


def test_a_token_can_come_from_a_file_and_stays_out_of_saved_configs(tmp_path: Path) -> None:
    from ajet.config import ConfigError, load_config, to_yaml

    (tmp_path / "token").write_text("file-held-token-789\n")
    (tmp_path / "t.jsonl").write_text('{"task_id": "a", "question": "q"}\n')
    conf = tmp_path / "c.yaml"
    conf.write_text(f"model: {{path: m}}\ntask_reader: {{jsonl: {{train_path: t.jsonl}}}}\n"
                    f"judge: {{params: {{note: '${{file:{tmp_path / 'token'}}}'}}}}\n")
    cfg = load_config(conf, require_workflow=False)
    assert cfg.judge.params["note"] == "file-held-token-789"
    assert "file-held-token-789" not in to_yaml(cfg) and "${file:" in to_yaml(cfg)
    conf.write_text("model: {path: m}\ntask_reader: {jsonl: {train_path: t.jsonl}}\n"
                    "serve: {client_token: '${file:/nonexistent/token}'}\n")
    with pytest.raises(ConfigError, match=r"serve.client_token.*cannot read /nonexistent/token"):
        load_config(conf, require_workflow=False)
