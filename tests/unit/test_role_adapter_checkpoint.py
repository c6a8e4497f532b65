"""Per-role LoRA adapters on disk (issue 26): a checkpoint holds and restores every adapter and
its optimizer state (`--resume`), and final_model/ exports each role's adapter in peft format,
and merged on request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ajet.config.schema import AlgorithmConfig, TrainerConfig
from ajet.context.pack import loss_weights, pack_samples
from ajet.rl.update import PolicyUpdater
from ajet.training.adapters import adapter_parameters
from ajet.training.checkpoint import load_checkpoint, save_checkpoint
from ajet.training.model import save_final_model
from ajet.training.optim import build_optimizer
from tests.unit.test_role_adapter_update import ROLES, role_model, sample
from tests.unit.tiny_models import tiny_llama


class Tokenizer:
    def save_pretrained(self, path: Path) -> None:
        Path(path, "tokenizer.json").write_text("{}")


def trained_model():
    """A role model after one step per role (every adapter moved, every one has AdamW state)."""
    model = role_model()
    trainer = TrainerConfig(lr=1e-2, grad_clip=1e9)
    optimizer, scheduler = build_optimizer(model, trainer)
    updater = PolicyUpdater(model, optimizer, trainer, AlgorithmConfig(), temperature=1.0, per_role_adapters=True)
    for role in ROLES:
        samples = [sample(role, [1, 2, 3], [4, 5], 1.0), sample(role, [1, 2, 3], [6], -1.0)]
        updater.update(pack_samples(samples, loss_weights(samples, "token_mean"), 4096, by_role=True))
    return model, optimizer, scheduler


def test_a_checkpoint_holds_and_restores_every_adapter(tmp_path: Path) -> None:
    model, optimizer, scheduler = trained_model()
    moments = {n: optimizer.state[p]["exp_avg"].clone() for r in ROLES for n, p in adapter_parameters(model, r).items()}
    # peft's set_adapter (outside ajet's update) freezes the other adapters: still all saved
    model.set_adapter("villager")
    assert not any(p.requires_grad for p in adapter_parameters(model, "wolf").values())
    ckpt = save_checkpoint(tmp_path / "ckpt", 3, model=model, optimizer=optimizer, scheduler=scheduler,
                           extra={}, keep_last=2)
    saved = torch.load(ckpt / "weights.pt", weights_only=True)
    for role in ROLES:
        assert set(adapter_parameters(model, role)) <= set(saved), role

    fresh = role_model()  # the same architecture, the adapters at their initial values
    fresh_optimizer, fresh_scheduler = build_optimizer(fresh, TrainerConfig())
    assert any(not torch.equal(p, dict(fresh.named_parameters())[n]) for n, p in model.named_parameters())
    state = load_checkpoint(ckpt, model=fresh, optimizer=fresh_optimizer, scheduler=fresh_scheduler)
    assert state["step"] == 3
    restored = dict(fresh.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), restored[name].detach()), name
    for name, moment in moments.items():  # AdamW's state of every adapter, on the same parameters
        assert torch.equal(fresh_optimizer.state[restored[name]]["exp_avg"], moment), name


def test_a_checkpoint_of_other_roles_is_refused_naming_the_setting(tmp_path: Path) -> None:
    model, optimizer, scheduler = trained_model()
    ckpt = save_checkpoint(tmp_path / "ckpt", 1, model=model, optimizer=optimizer, scheduler=scheduler,
                           extra={}, keep_last=1)
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    other = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                           adapter_name="wolf")  # no villager adapter
    with pytest.raises(RuntimeError, match="per_role: the same trainable_targets"):
        load_checkpoint(ckpt, model=other, optimizer=build_optimizer(other, TrainerConfig())[0],
                        scheduler=scheduler)


@pytest.mark.parametrize("export_merged", [False, True])
def test_final_model_exports_each_roles_adapter_and_merged_on_request(tmp_path: Path, export_merged: bool) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, _, _ = trained_model()
    out = save_final_model(model, Tokenizer(), tmp_path / "final_model", lora=True, per_role=True,
                           export_merged=export_merged)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    base = AutoModelForCausalLM.from_pretrained(out)  # final_model/ itself: the untrained base
    with torch.no_grad(), model.disable_adapter():
        assert torch.allclose(base(ids).logits, model(ids).logits, atol=1e-5)
    assert sorted(p.name for p in (out / "adapters").iterdir()) == sorted(ROLES)
    logits = {}
    for role in ROLES:
        adapter_dir = out / "adapters" / role
        assert json.loads((adapter_dir / "adapter_config.json").read_text())["r"] == 4
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out), adapter_dir)
        model.set_adapter(role)
        with torch.no_grad():
            logits[role] = model(ids).logits
            assert torch.allclose(loaded(ids).logits, logits[role], atol=1e-5), role
        if export_merged:
            merged = AutoModelForCausalLM.from_pretrained(out / "merged" / role)
            with torch.no_grad():
                assert torch.allclose(merged(ids).logits, logits[role], atol=1e-5), role
            assert (out / "merged" / role / "tokenizer.json").is_file()
    assert not torch.allclose(logits["wolf"], logits["villager"])  # two different policies
    assert (out / "merged").exists() == export_merged
    assert not list(out.glob(".stage-*"))
