"""`ajet eval` on one role's adapter of a per-role run (issue 26): `--model
RUN/final_model/adapters/<role>` (a peft adapter dir, merged into the base beside it) or
`--role <name>` with the run's final_model/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ajet.cli import eval as eval_cmd
from ajet.config import load_config
from ajet.config.schema import ModelConfig
from ajet.errors import ConfigError, ModelNotFoundError
from ajet.eval import runner as eval_runner
from ajet.models.load import load_model_and_tokenizer, model_source, role_adapter_dir
from ajet.training.adapters import adapter_parameters
from ajet.training.model import save_final_model

runner = CliRunner()
ROLES = ("wolf", "villager")


@pytest.fixture()
def export(tmp_path: Path, tiny_model_dir: Path):
    """(final_model/ of a per-role run on the tiny model, the trained peft model)."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def config():
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config(), adapter_name=ROLES[0])
    model.add_adapter(ROLES[1], config())
    torch.manual_seed(5)
    with torch.no_grad():
        for role in ROLES:
            for param in adapter_parameters(model, role).values():
                param.normal_(0, 0.2)
    out = save_final_model(model, AutoTokenizer.from_pretrained(tiny_model_dir), tmp_path / "run" / "final_model",
                           lora=True, per_role=True)
    return out, model


def test_an_adapter_dir_loads_merged_into_the_base_beside_it(export) -> None:
    out, trained = export
    ids = torch.tensor([[1, 2, 3, 4]])
    for role in ROLES:
        path = out / "adapters" / role
        assert model_source(ModelConfig(path=str(path))) == (out, path)
        model, tokenizer = load_model_and_tokenizer(ModelConfig(path=str(path), device="cpu"))
        trained.set_adapter(role)
        with torch.no_grad():
            assert torch.allclose(model(ids).logits, trained(ids).logits, atol=1e-5), role
        assert not hasattr(model, "peft_config")  # merged: a plain model for the engine
        assert tokenizer.eos_token_id is not None  # the base's tokenizer


def test_an_adapter_elsewhere_finds_its_base_by_name_or_says_what_is_missing(export, tmp_path: Path,
                                                                             tiny_model_dir: Path) -> None:
    out, _ = export
    moved = tmp_path / "moved"
    (out / "adapters" / "wolf").rename(moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tiny_model_dir)
    (moved / "adapter_config.json").write_text(json.dumps(config))
    assert model_source(ModelConfig(path=str(moved))) == (tiny_model_dir, moved)
    config["base_model_name_or_path"] = None
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelNotFoundError, match="names no base model"):
        model_source(ModelConfig(path=str(moved)))


def test_role_picks_the_roles_adapter_of_a_final_model_or_run_dir(export) -> None:
    out, _ = export
    assert role_adapter_dir(out, "wolf") == out / "adapters" / "wolf"
    assert role_adapter_dir(out.parent, "villager") == out / "adapters" / "villager"  # the run dir
    with pytest.raises(ModelNotFoundError, match=r"no adapter of role 'seer'; its roles: \['villager', 'wolf'\]"):
        role_adapter_dir(out, "seer")
    with pytest.raises(ModelNotFoundError, match="model.lora.per_role=true"):
        role_adapter_dir(out / "adapters", "wolf")


def test_cli_role_and_model_reach_evaluate_with_the_adapter(export, two_calls_conf: Path,
                                                          evaluated_models: list[str]) -> None:
    out, _ = export
    for args in (["--model", str(out), "--role", "villager"], ["--model", str(out / "adapters" / "villager")]):
        result = runner.invoke(eval_cmd.app, ["--conf", str(two_calls_conf), *args])
        assert result.exit_code == 0, result.output
    assert evaluated_models == [str((out / "adapters" / "villager").resolve())] * 2
    bad = runner.invoke(eval_cmd.app, ["--conf", str(two_calls_conf), "--model", str(out), "--role", "seer"])
    assert bad.exit_code != 0 and "its roles: ['villager', 'wolf']" in bad.output and "Traceback" not in bad.output


def test_export_merged_without_per_role_adapters_is_refused_naming_the_setting(two_calls_conf: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.lora.export_merged.*needs model.lora.per_role=true"):
        load_config(two_calls_conf, ["model.lora.enabled=true", "model.lora.export_merged=true"])
    cfg = load_config(two_calls_conf, ["model.lora.enabled=true", "model.lora.per_role=true",
                                       "model.lora.export_merged=true"])
    assert cfg.model.lora.export_merged


def test_a_per_role_final_model_is_served_with_every_roles_adapter(export, tiny_model_dir: Path) -> None:
    """With model.lora.per_role, evaluating a per-role run's final_model/ plays each role with its
    own adapter and "initial" with the base, as training's validation did (the pipeline's eval
    stage after a per-role training stage evaluates this way)."""
    from ajet.models.load import role_adapter_dirs, with_role_adapters

    out, trained = export
    assert list(role_adapter_dirs(out)) == ["villager", "wolf"]
    assert role_adapter_dirs(tiny_model_dir) == {} and role_adapter_dirs(out / "adapters") == {}
    base, _ = load_model_and_tokenizer(ModelConfig(path=str(out), device="cpu"))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        base_logits = base(ids).logits.clone()
        model = with_role_adapters(base, role_adapter_dirs(out))
        assert sorted(model.peft_config) == ["villager", "wolf"]
        for role in ROLES:
            model.set_adapter(role)
            trained.set_adapter(role)
            assert torch.allclose(model(ids).logits, trained(ids).logits, atol=1e-5), role
        with model.disable_adapter():
            assert torch.allclose(model(ids).logits, base_logits, atol=1e-6)
        assert not torch.allclose(trained(ids).logits, base_logits, atol=1e-3)  # the adapters do something


def test_evaluate_loads_the_role_adapters_only_with_per_role(export, two_calls_conf: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = export
    served: list[object] = []

    class Stop(Exception):
        pass

    def fake_rollout(cfg, model, *args, **kwargs):  # noqa: ANN001, ANN202 - stands in for EngineRollout.local
        served.append(model)
        raise Stop

    monkeypatch.setattr(eval_runner.EngineRollout, "local", fake_rollout)
    for per_role in ("true", "false"):
        cfg = load_config(two_calls_conf, [f"model.path={out}", "model.device=cpu", "model.lora.enabled=true",
                                           f"model.lora.per_role={per_role}", "eval.split=train"])
        with pytest.raises(Stop):
            eval_runner.evaluate(cfg)
    assert sorted(served[0].peft_config) == ["villager", "wolf"]
    assert not hasattr(served[1], "peft_config")  # per_role off: the base as it is
