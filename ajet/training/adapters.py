"""Per-role LoRA adapters in training (`model.lora.per_role`): one peft adapter per trainable
role, named by the role, on one shared frozen base.

Each role's samples update only its adapter: they are packed per role
(`pack_samples(by_role=True)`) and each packed sequence is forwarded inside
`active_adapter(model, seq.role)`. An adapter that was not active in any forward of a step gets
no gradient (its `grad` stays None), and AdamW skips a parameter without a gradient (no
moment update, no weight decay), so it stays bit-identical.

peft's `set_adapter` also sets `requires_grad=False` on every other adapter; the optimizer,
the checkpoints (`trainable_state_dict`) and the next role's step need them all trainable, so
`active_adapter` makes every adapter's parameters trainable again on the way out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeGuard, cast

if TYPE_CHECKING:
    import torch
    from peft import PeftModel


def is_peft(model: torch.nn.Module) -> TypeGuard[PeftModel]:
    """Whether `model` holds peft adapters (`peft_config`): hasattr, as these checks always were,
    not isinstance, which would import peft (seconds) where LoRA is off."""
    return hasattr(model, "peft_config")


def role_adapters(model: torch.nn.Module) -> list[str]:
    """The names of a peft model's role adapters; [] for a model without any. Names starting
    with "__" are ajet's own (the distillation teacher's `__teacher__`), never a role's."""
    return [name for name in getattr(model, "peft_config", None) or {} if not name.startswith("__")]


def adapter_parameters(model: torch.nn.Module, adapter: str) -> dict[str, torch.nn.Parameter]:
    """{name: parameter} of one adapter's weights (peft names them `...lora_A.<adapter>.weight`)."""
    return {name: p for name, p in model.named_parameters() if adapter_of(name) == adapter}


def adapter_of(name: str) -> str | None:
    """The adapter a parameter name belongs to: the part after a `lora_*` part; None for the base."""
    parts = name.split(".")
    return next((parts[i + 1] for i in range(len(parts) - 1) if parts[i].startswith("lora_")), None)


@contextmanager
def active_adapter(model: torch.nn.Module, role: str) -> Iterator[None]:
    """Forwards inside the block go through `role`'s adapter; afterwards the adapter active
    before is active again and every adapter's parameters are trainable (see the module doc)."""
    adapters = role_adapters(model)
    if role not in adapters or not is_peft(model):  # a role's adapter makes it a peft model
        raise KeyError(
            f"role {role!r} has no LoRA adapter (adapters: {adapters}); with model.lora.per_role each "
            "trainable role has one: add the role to trainable_targets (workflow.trainable_targets), "
            "or keep its calls untrained")
    previous = model.active_adapter
    model.set_adapter(role)
    try:
        yield
    finally:
        model.set_adapter(previous)
        for name in adapters:
            for param in adapter_parameters(model, name).values():
                param.requires_grad_(True)


@contextmanager
def reference_adapter(reference: torch.nn.Module, role: str) -> Iterator[None]:
    """A frozen copy of a per-role model (the KL reference `frozen`) forwards through `role`'s
    adapter inside the block: the role's initial policy. The copy stays frozen (set_adapter
    would make the role's adapter trainable)."""
    frozen = cast("PeftModel", reference)  # a copy of the peft model that per-role adapters train
    previous = frozen.active_adapter
    frozen.set_adapter(role)
    frozen.requires_grad_(False)
    try:
        yield
    finally:
        frozen.set_adapter(previous)
        frozen.requires_grad_(False)
