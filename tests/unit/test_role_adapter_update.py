"""Per-role LoRA adapters in the policy update (issue 26): a role's samples update its adapter
only; the other adapters and the base stay bit-identical; packing never mixes roles."""

from __future__ import annotations

import pytest
import torch

from ajet.config.schema import AlgorithmConfig, TrainerConfig
from ajet.context.pack import loss_weights, pack_samples
from ajet.context.types import Sample
from ajet.rl.update import PolicyUpdater
from ajet.training.adapters import active_adapter, adapter_parameters
from ajet.training.optim import build_optimizer
from tests.unit.tiny_models import tiny_llama

ROLES = ("wolf", "villager")


def role_model():
    """A tiny Llama with one LoRA adapter per role, every adapter trainable (engineer A's contract)."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    def config():
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

    model = get_peft_model(tiny_llama(), config(), adapter_name=ROLES[0])
    for role in ROLES[1:]:
        model.add_adapter(role, config())
    torch.manual_seed(3)
    with torch.no_grad():  # lora_B starts at 0: give every adapter an effect of its own
        for role in ROLES:
            for param in adapter_parameters(model, role).values():
                param.normal_(0, 0.1)
                param.requires_grad_(True)
    model.eval()
    return model


def sample(role: str, prompt: list[int], completion: list[int], advantage: float) -> Sample:
    ids = prompt + completion
    mask = [0] * len(prompt) + [1] * len(completion)
    return Sample(input_ids=ids, loss_mask=mask, old_logprobs=[-4.0 * m for m in mask],
                  advantage=[advantage * m for m in mask], role=role, episode_id=f"{role}-{advantage}")


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed(model, before: dict[str, torch.Tensor], names) -> list[str]:
    params = dict(model.named_parameters())
    return [n for n in names if not torch.equal(params[n].detach(), before[n])]


def update(model, samples: list[Sample], algorithm: AlgorithmConfig) -> dict[str, float]:
    trainer = TrainerConfig(lr=1e-2, weight_decay=0.1, grad_clip=1e9)  # decay would touch a skipped adapter
    updater = PolicyUpdater(model, build_optimizer(model, trainer)[0], trainer, algorithm, temperature=1.0,
                            per_role_adapters=True)
    return updater.update(pack_samples(samples, loss_weights(samples, "token_mean"), 4096, by_role=True))


@pytest.mark.parametrize("kl_reference", ["lora_base", "frozen"])
@pytest.mark.parametrize("role", ROLES)  # "wolf" is peft's active adapter, "villager" is not
def test_a_step_on_one_roles_samples_leaves_the_other_adapter_and_the_base_bit_identical(role, kl_reference) -> None:
    model = role_model()
    before = snapshot(model)
    trained = set(adapter_parameters(model, role))
    other = set(adapter_parameters(model, next(r for r in ROLES if r != role)))
    base = set(before) - trained - other
    assert trained and other and base

    metrics = update(model, [sample(role, [1, 2, 3], [4, 5, 6], 1.0), sample(role, [1, 2, 3], [7, 8], -1.0)],
                     AlgorithmConfig(kl_coef=0.1, kl_reference=kl_reference))

    assert changed(model, before, other) == []
    assert changed(model, before, base) == []
    assert len(changed(model, before, trained)) == len(trained)
    # peft's set_adapter froze the other adapter; the update leaves every adapter trainable
    # (all stay in the optimizer and in checkpoints) and the adapter active before active again.
    assert all(p.requires_grad for r in ROLES for p in adapter_parameters(model, r).values())
    assert model.active_adapter == "wolf"
    # Before the step the policy is the reference: the role's initial adapter (frozen) gives KL 0;
    # the base (lora_base) differs from it (the adapters are not 0 here).
    if kl_reference == "frozen":
        assert metrics["actor/kl"] == pytest.approx(0.0, abs=1e-7)
    else:
        assert metrics["actor/kl"] > 1e-6


def test_a_mixed_step_moves_each_adapter_with_its_own_samples_only() -> None:
    """Two steps from the same weights: wolf+villager samples, and villager samples alone. The
    villager adapter ends the same in both (the wolf samples never reached it)."""
    samples = [sample("wolf", [1, 2, 3], [4, 5], 1.0), sample("villager", [1, 2, 3], [9, 10], -1.0),
               sample("villager", [1, 2, 3], [11], 1.0)]
    both, alone = role_model(), role_model()
    update(both, samples, AlgorithmConfig())
    # Alone: the same villager samples with the same loss weights (token_mean over all three).
    weights = loss_weights(samples, "token_mean")
    trainer = TrainerConfig(lr=1e-2, weight_decay=0.1, grad_clip=1e9)
    updater = PolicyUpdater(alone, build_optimizer(alone, trainer)[0], trainer, AlgorithmConfig(), temperature=1.0,
                            per_role_adapters=True)
    updater.update(pack_samples(samples[1:], weights[1:], 4096, by_role=True))

    for name, param in adapter_parameters(both, "villager").items():
        assert torch.allclose(param, dict(alone.named_parameters())[name], atol=1e-6), name
    untouched = role_model()
    assert changed(both, snapshot(untouched), adapter_parameters(both, "wolf"))
    assert not changed(alone, snapshot(untouched), adapter_parameters(alone, "wolf"))


def test_pack_by_role_never_mixes_roles_and_keeps_sample_indices() -> None:
    # The two roles share the prefix [1, 2, 3]: packed together it would be one tree.
    samples = [sample("wolf", [1, 2, 3], [4, 5], 1.0), sample("villager", [1, 2, 3], [6], 1.0),
               sample("wolf", [1, 2, 3], [7], -1.0)]
    weights = loss_weights(samples, "token_mean")
    assert len(pack_samples(samples, weights, 4096)) == 1
    packed = pack_samples(samples, weights, 4096, by_role=True)
    assert [seq.role for seq in packed] == ["wolf", "villager"]
    for seq in packed:
        assert {samples[i].role for i in seq.entry_sample} == {seq.role}
    assert sorted(i for seq in packed for i in set(seq.entry_sample)) == [0, 1, 2]
    assert [(seq.entry_token, seq.entry_sample) for seq in packed] == [([4, 5, 7], [0, 0, 2]), ([6], [1])]


def test_per_role_update_refuses_sequences_packed_across_roles_and_roles_without_adapter() -> None:
    model = role_model()
    trainer = TrainerConfig()
    updater = PolicyUpdater(model, build_optimizer(model, trainer)[0], trainer, AlgorithmConfig(), temperature=1.0,
                            per_role_adapters=True)
    samples = [sample("wolf", [1, 2], [3], 1.0), sample("villager", [1, 2], [4], -1.0)]
    with pytest.raises(ValueError, match="by_role=True"):
        updater.update(pack_samples(samples, loss_weights(samples, "token_mean"), 4096))
    seer = [sample("seer", [1, 2], [3], 1.0)]
    with pytest.raises(KeyError, match="role 'seer' has no LoRA adapter.*trainable_targets"):
        updater.update(pack_samples(seer, loss_weights(seer, "token_mean"), 4096, by_role=True))
    with active_adapter(model, "villager"):
        assert model.active_adapter == "villager"
    assert model.active_adapter == "wolf"
