"""`ajet eval --model RUN/checkpoints/step_N` (or RUN/checkpoints: the newest): a training
checkpoint holds only what training changed, so it is exported once, with the run's
config.yaml, into step_N/model/, and that export computes what the trained model computed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ajet.cli import eval as eval_cmd
from ajet.config import load_config, to_yaml
from ajet.config.schema import ModelConfig
from ajet.errors import ModelNotFoundError
from ajet.models.load import load_model_and_tokenizer, role_adapter_dirs, with_role_adapters
from ajet.models.resolve import resolve_model_path
from ajet.training.checkpoint import save_checkpoint, trainable_names
from ajet.training.export import export_checkpoint, training_checkpoint
from ajet.training.model import load_trainable_model

runner = CliRunner()
IDS = torch.tensor([[1, 2, 3, 4, 5]])


def _train_and_save(run: Path, two_calls_conf: Path, overrides: list[str], roles=None, steps=(1, 2)):
    """A run directory with config.yaml and checkpoints of a model whose trainable weights were
    moved (a stand-in for training); returns (the model, {step: its logits then})."""
    cfg = load_config(two_calls_conf, ["model.device=cpu", f"project.exp_dir={run.parent}",
                                       f"project.name={run.name}", *overrides])
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(cfg))
    model, _ = load_trainable_model(cfg.model, seed=0, trainable_targets=roles)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    names = trainable_names(model)
    logits = {}
    for step in steps:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in names:
                    param.add_(torch.randn_like(param) * 0.05)
            logits[step] = model(IDS).logits.clone()
        save_checkpoint(run / "checkpoints", step, model=model, optimizer=optimizer, scheduler=scheduler,
                        extra={}, keep_last=0)
    return model, logits


@pytest.mark.parametrize("lora", [False, True])
def test_a_checkpoint_exports_to_the_model_it_saved(tmp_path: Path, two_calls_conf: Path, lora: bool) -> None:
    run = tmp_path / "exp" / "run"
    _, logits = _train_and_save(run, two_calls_conf, [f"model.lora.enabled={str(lora).lower()}"])
    ckpts = run / "checkpoints"
    assert training_checkpoint(ckpts) == ckpts / "step_000002"  # the newest
    assert training_checkpoint(ckpts / "step_000001") == ckpts / "step_000001"
    for step in (1, 2):
        out = export_checkpoint(ckpts / f"step_{step:06d}")
        assert out == ckpts / f"step_{step:06d}" / "model" and (out / "config.json").is_file()
        model, tokenizer = load_model_and_tokenizer(ModelConfig(path=str(out), device="cpu"))
        assert not hasattr(model, "peft_config")  # LoRA: merged, a plain model for the engine
        with torch.no_grad():
            assert torch.allclose(model(IDS).logits, logits[step], atol=1e-4), step
        assert tokenizer.eos_token_id is not None
    assert not torch.allclose(logits[1], logits[2], atol=1e-3)  # the steps differ: the check can fail
    mtime = (out / "config.json").stat().st_mtime_ns
    assert export_checkpoint(ckpts / "step_000002") == out and (out / "config.json").stat().st_mtime_ns == mtime


def test_a_per_role_checkpoint_exports_every_roles_adapter(tmp_path: Path, two_calls_conf: Path) -> None:
    pytest.importorskip("peft")
    run = tmp_path / "exp" / "run"
    trained, logits = _train_and_save(run, two_calls_conf, ["model.lora.enabled=true", "model.lora.per_role=true"],
                                      roles=["wolf", "villager"], steps=(1,))
    out = export_checkpoint(run / "checkpoints" / "step_000001")
    assert sorted(role_adapter_dirs(out)) == ["villager", "wolf"]
    base, _ = load_model_and_tokenizer(ModelConfig(path=str(out), device="cpu"))
    model = with_role_adapters(base, role_adapter_dirs(out))
    with torch.no_grad():
        for role in ("wolf", "villager"):
            model.set_adapter(role)
            trained.set_adapter(role)
            assert torch.allclose(model(IDS).logits, trained(IDS).logits, atol=1e-4), role


def test_what_is_not_a_whole_checkpoint_is_refused_saying_why(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert training_checkpoint(tiny_model_dir) is None  # a model directory: loaded as it is
    half = tmp_path / "run" / "checkpoints" / "step_000003"
    half.mkdir(parents=True)
    (half / "weights.pt").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="never completed"):
        training_checkpoint(half)
    with pytest.raises(ModelNotFoundError, match="holds no complete checkpoint"):
        training_checkpoint(half.parent)
    (half / ".complete").write_text("3")
    with pytest.raises(ModelNotFoundError, match="has no config.yaml"):
        export_checkpoint(half)
    with pytest.raises(ModelNotFoundError, match=r"looks like a run directory: give its checkpoints/"):
        resolve_model_path(str(half.parent.parent))  # the run directory itself


def test_cli_eval_takes_a_runs_checkpoints(tmp_path: Path, two_calls_conf: Path, evaluated_models: list[str]) -> None:
    run = tmp_path / "exp" / "run"
    _train_and_save(run, two_calls_conf, [], steps=(1,))
    result = runner.invoke(eval_cmd.app, ["--conf", str(two_calls_conf), "--model", str(run / "checkpoints")])
    assert result.exit_code == 0, result.output
    assert evaluated_models == [str((run / "checkpoints" / "step_000001" / "model").resolve())]
