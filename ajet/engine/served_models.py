"""Which model serves a request of the local engine: `LocalEngine.generate(..., model=...)`.

- `None`: the policy, as today: the trainer's model (with LoRA, the adapter active when the
  engine started: the only one, or with `model.lora.per_role` the first role's);
- an adapter's name (with `model.lora.per_role`, each trainable role has one, named by the role);
- `"initial"` (`INITIAL_MODEL`): the frozen initial weights. Given `initial` (a checkpoint
  directory: a pipeline stage's `model.initial_path`, the model the pipeline started from), that
  directory, served as below. Otherwise: with LoRA, the base with no adapter
  (peft's "__base__" rows: no extra weight memory). With full fine-tuning, a frozen copy of the
  weights taken on the engine thread at the first request for it, before the first update
  (policy version 0); a run that asks later (a resumed run) reloads the model's own checkpoint
  directory instead. An engine whose weights never change (`fixed`: an evaluation) serves it
  with the policy itself, in the policy's batches and KV;
- a local directory: a Hugging Face checkpoint, or a peft adapter of this model's base (merged
  into a copy of the base), loaded once and frozen.

Rows of one module run in one forward: the policy's adapters through peft's mixed-batch LoRA
forward (`adapter_names`, one adapter per row; each row's KV is its own, in prefill and decode
alike), so a mixed batch computes what one forward per adapter would. For plain LoRA linears
the engine batches that forward itself (`_stacked_mixed_forward`: every token through all the
adapters' A and B stacked, two plain matmuls a layer, each row keeping its own adapter's
columns, instead of peft's few small ops per adapter). A frozen copy or a loaded
checkpoint is another module (a `unit`): the engine keeps one decode batch per unit. The
prefix cache keys its entries by `Target.namespace` (unit, adapter) as well as by tokens:
KV of one adapter never serves another's request. Frozen modules are served in the dtype they
were loaded in (the trainer's), whatever `rollout.engine_dtype`; their memory is logged.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch  # this module is imported only where the engine runs (like kv.py, prefill.py)

from ajet.engine.base import INITIAL_MODEL
from ajet.engine.requests import POLICY, Target

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch
# What must agree between the policy and a checkpoint served beside it: prompts are the
# policy tokenizer's ids, so the vocabulary must be the same one.
_VOCAB_KEYS = ("vocab_size", "bos_token_id", "eos_token_id")
# What must agree between the policy's base and an adapter's base (the adapter's shapes).
_BASE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size")


class FrozenModel:
    """A module served beside the policy and never trained (what a decode batch forwards)."""

    def __init__(self, model: Any, what: str) -> None:
        model.eval()
        model.requires_grad_(False)
        self.model = model
        self.nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        log.info("engine serves %s: %.2f GB of weights beside the policy's", what, self.nbytes / 1e9)


class ServedModels:
    """The policy, its adapters and the frozen models of one engine (see the module docstring).

    `target(name)` resolves a request's `model` (cheap, any thread); `load(target)` loads a
    checkpoint unit (slow: call it off the engine thread); `unit(key, version)` is what the
    engine thread forwards for a unit, taking the frozen initial copy when first needed."""

    def __init__(self, policy: Any, fixed: bool = False, initial: str | None = None) -> None:
        self.policy = policy  # ServingWeights: .model is forwarded, .source is the trainer's model
        self.fixed = fixed  # the weights never change: "initial" is the policy (module docstring)
        self.initial = initial  # a checkpoint directory "initial" names, else None (module docstring)
        source = policy.source
        self.lora = hasattr(source, "peft_config")
        active = getattr(source, "active_adapter", None) if self.lora else None
        self.policy_adapter: str | None = active if isinstance(active, str) else None
        self._units: dict[str, FrozenModel] = {}
        self._lock = threading.Lock()  # loading: one caller loads a checkpoint, the others wait
        if self.lora:
            install_row_adapters(policy.model)

    @property
    def adapters(self) -> tuple[str, ...]:
        """The policy's LoRA adapters, read from peft each time: one added after the engine
        started (an `ajet tinker` training client) is served at once, on LoRA layers that
        already existed (the row hooks are installed once, at start)."""
        return tuple(self.policy.source.peft_config) if self.lora else ()

    # ---------------------------------------------------------------- resolving
    def target(self, name: str | None) -> Target:
        """The target of a request's `model`; ValueError naming what is served when unknown."""
        if name is None or (name == self.policy_adapter):
            return Target(POLICY, self.policy_adapter)
        if not isinstance(name, str) or not name:
            raise ValueError(f"model={name!r}: give None (the policy), an adapter name, "
                             f"{INITIAL_MODEL!r} or a local checkpoint directory")
        if name in self.adapters:
            return Target(POLICY, name, (POLICY, name))
        if name == INITIAL_MODEL and self.initial is not None:
            name = self.initial
        elif name == INITIAL_MODEL:
            if self.lora:
                return Target(POLICY, BASE_ADAPTER, (POLICY, BASE_ADAPTER))
            if self.fixed:
                return Target(POLICY, self.policy_adapter)
            return Target(INITIAL_MODEL, None, (INITIAL_MODEL, None))
        path = Path(name).expanduser()
        if not path.is_dir():
            served = ", ".join(repr(a) for a in self.adapters) or "none"
            raise ValueError(
                f"model={name!r} is not served by this engine: it is neither one of its LoRA adapters "
                f"({served}), {INITIAL_MODEL!r}, nor an existing local checkpoint directory. Register a "
                "role with default_model='initial' or a path to a Hugging Face checkpoint / peft adapter")
        key = str(path.resolve())
        return Target(key, None, (key, None))

    def check(self, name: str | None) -> Target:
        """`target(name)`, and for a directory, that it fits the policy (its config files only,
        no weights loaded): the fix is in the message. What `register_model` calls."""
        target = self.target(name)
        if target.unit not in (POLICY, INITIAL_MODEL):
            check_directory(Path(target.unit), self.policy.source)
        return target

    def needs_load(self, target: Target, version: int) -> bool:
        """Whether `load(target)` must run (off the engine thread) before the request is served:
        a checkpoint not loaded yet, or the initial weights once they changed (reloaded)."""
        if target.unit == POLICY or target.unit in self._units:
            return False
        return target.unit != INITIAL_MODEL or version > 0

    def load(self, target: Target) -> None:
        """Load a checkpoint unit once (slow; off the engine thread)."""
        with self._lock:
            if target.unit in self._units or target.unit == POLICY:
                return
            if target.unit == INITIAL_MODEL:
                self._units[INITIAL_MODEL] = self._initial(version=-1)  # the weights changed: reload
                return
            model = load_directory(Path(target.unit), self.policy.source)
            self._units[target.unit] = FrozenModel(model, f"the checkpoint {target.unit} (frozen)")

    def unit(self, key: str, version: int) -> Any:
        """What the engine thread forwards for `key`: the policy's weights or a frozen model."""
        if key == POLICY:
            return self.policy
        frozen = self._units.get(key)
        if frozen is None and key == INITIAL_MODEL:
            with self._lock:  # a caller may be reloading it (`load`)
                frozen = self._units.get(key) or self._initial(version)
                self._units[key] = frozen
        if frozen is None:
            raise RuntimeError(f"model {key!r} was not loaded before it was served")
        return frozen

    def _initial(self, version: int) -> FrozenModel:
        """The frozen initial weights of a fully fine-tuned policy: a copy of the trainer's
        model while it is still the initial one (engine thread, no update in flight), else
        its checkpoint directory reloaded."""
        source = self.policy.source
        if version == 0:  # engine thread: no update can be in flight
            with torch.no_grad():
                model = copy.deepcopy(source)
            return FrozenModel(model, "default model 'initial' (a frozen copy of the initial weights, "
                                      "taken before the first update)")
        path = Path(str(getattr(source, "name_or_path", "") or ""))
        if not (path / "config.json").is_file():
            raise ValueError(
                f"default_model={INITIAL_MODEL!r}: the weights already changed since the engine started "
                "and the model has no checkpoint directory to reload them from; call a role registered "
                "with it before the first update, or give the initial checkpoint's path as its default_model")
        model = load_directory(path, source)
        return FrozenModel(model, f"default model 'initial' (reloaded from {path}, frozen)")


def frozen_namespace(namespace: Any) -> bool:
    """Whether a prefix-cache namespace's KV stays valid across weight updates: a frozen model's
    (the initial copy, a loaded checkpoint) and, under LoRA, the base's without any adapter (the
    trainer never changes it). The policy's and its adapters' KV change with every update."""
    if not isinstance(namespace, tuple) or len(namespace) != 2:
        return False
    unit, adapter = namespace
    return unit != POLICY or adapter == BASE_ADAPTER


# ---------------------------------------------------------------------- checkpoints
def _config(path: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((path / name).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read {name}: {exc}") from exc


def check_directory(path: Path, policy: Any) -> None:
    """A served checkpoint must speak the policy's tokens; a peft adapter must fit its base."""
    if (path / "adapter_config.json").is_file():
        _check_adapter(path, policy)
        return
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has neither config.json (a Hugging Face checkpoint) nor "
                         "adapter_config.json (a peft adapter); give a directory saved with save_pretrained")
    theirs = _config(path, "config.json")
    ours = _base_config(policy)
    diff = {k: (theirs.get(k), ours.get(k)) for k in _VOCAB_KEYS if theirs.get(k) != ours.get(k)}
    if diff:
        raise ValueError(
            f"the checkpoint {path} does not share the model's vocabulary ({_diff_text(diff)}): prompts "
            "are the policy tokenizer's token ids. Give a checkpoint of the same model family (same "
            "tokenizer), e.g. an earlier final_model/ of this run")


def _check_adapter(path: Path, policy: Any) -> None:
    adapter = _config(path, "adapter_config.json")
    named = str(adapter.get("base_model_name_or_path") or "")
    ours_path = str(getattr(_base_model(policy), "name_or_path", "") or "")
    if named and ours_path and Path(named).expanduser().resolve() == Path(ours_path).expanduser().resolve():
        return
    if named and (Path(named).expanduser() / "config.json").is_file():
        theirs, ours = _config(Path(named).expanduser(), "config.json"), _base_config(policy)
        diff = {k: (theirs.get(k), ours.get(k)) for k in _BASE_KEYS if theirs.get(k) != ours.get(k)}
        if diff:
            raise ValueError(
                f"the peft adapter {path} was trained on {named}, whose shapes differ from the model's "
                f"({_diff_text(diff)}); give an adapter trained on this run's model.path")
        return
    log.warning("the peft adapter %s names its base %r, not this model (%r); its shapes are checked "
                "when it loads", path, named, ours_path)


def load_directory(path: Path, policy: Any) -> Any:
    """A frozen model from a checkpoint directory, on the policy's device and dtype: a Hugging
    Face checkpoint, or a peft adapter merged into a fresh copy of the policy's base."""
    from transformers import AutoModelForCausalLM

    check_directory(path, policy)
    weight = policy.get_input_embeddings().weight
    if not (path / "adapter_config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=weight.dtype)
        return model.to(weight.device)
    from peft import PeftModel  # a peft adapter directory only

    base_dir = Path(str(getattr(_base_model(policy), "name_or_path", "") or ""))
    if not (base_dir / "config.json").is_file():
        raise ValueError(f"the peft adapter {path} needs the model's base checkpoint to merge into, and the "
                         "model has no checkpoint directory; give a merged Hugging Face checkpoint instead")
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=weight.dtype)
    try:
        merged = PeftModel.from_pretrained(base, path).merge_and_unload()
    except RuntimeError as exc:  # size mismatch: the adapter was trained on another base
        raise ValueError(f"the peft adapter {path} does not fit the model's base {base_dir}: {exc}") from exc
    return merged.to(weight.device)


def _base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _base_config(model: Any) -> dict[str, Any]:
    return _base_model(model).config.to_dict()


def _diff_text(diff: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k}: {theirs} vs the model's {ours}" for k, (theirs, ours) in diff.items())


# ---------------------------------------------------------------------- mixed-adapter rows
_ROWS = threading.local()  # the engine thread's per-row adapter names during one forward


def install_row_adapters(model: Any) -> None:
    """A forward pre-hook on each LoRA layer that hands it the adapter of each row while the
    engine thread forwards a mixed batch (`row_adapters`), for peft's mixed-batch forward.

    Why not peft's `model(..., adapter_names=...)`: it registers its hooks on the shared
    modules for the length of the forward, where a forward of the trainer on another thread
    would pick them up. These hooks read a thread-local: other threads never see the names."""
    if getattr(model, "_ajet_row_adapters", False):
        return
    from peft.tuners.lora.layer import Linear as LoraLinear

    for module in model.modules():
        if hasattr(module, "_mixed_batch_forward"):  # a peft LoRA layer
            module.register_forward_pre_hook(_inject_adapter_names, with_kwargs=True)
            if isinstance(module, LoraLinear):  # its rows' LoRA terms batched (see below)
                module._mixed_batch_forward = types.MethodType(_stacked_mixed_forward, module)  # type: ignore[method-assign]
    model._ajet_row_adapters = True


def _stacked_mixed_forward(self: Any, x: Any, *args: Any, adapter_names: list[str], **kwargs: Any) -> Any:
    """peft's mixed-batch LoRA forward for a `lora.Linear`, batched: every row goes through the
    adapters' A matrices stacked, keeps its own adapter's columns, then through the scaled B
    matrices side by side: two matmuls whatever the number of adapters (peft loops over the
    adapters, several small ops each, in every layer of every step). A row of "__base__" (or of
    an adapter this layer lacks) adds nothing. Layers whose adapters differ in rank or have a
    bias, dropout in training mode or a variant (DoRA, ...) take peft's own path."""
    from peft.tuners.lora.layer import VARIANT_KWARG_KEYS

    present = [name for name in dict.fromkeys(adapter_names) if name in self.lora_A]
    if not present or any(
            name in self.lora_variant or self.lora_B[name].bias is not None
            or self.lora_A[name].weight.shape != self.lora_A[present[0]].weight.shape
            or (self.training and not isinstance(self.lora_dropout[name], torch.nn.Identity))
            for name in present):
        return type(self)._mixed_batch_forward(self, x, *args, adapter_names=adapter_names, **kwargs)
    for key in VARIANT_KWARG_KEYS:
        kwargs.pop(key, None)
    result = self.base_layer(x, *args, **kwargs)
    # Every present adapter's A stacked (P*r, in) and scaled B side by side (out, P*r): each
    # token goes through all of them in two plain matmuls, and a row keeps only its own
    # adapter's r columns in between (a "__base__" row none).
    rank = self.lora_A[present[0]].weight.shape[0]
    a = torch.cat([self.lora_A[name].weight for name in present])
    b = torch.cat([self.lora_B[name].weight * self.scaling[name] for name in present], dim=1)
    # The mask depends on the rows' adapters only: made once per forward (`row_adapters`), not
    # in each of the forward's LoRA layers.
    masks = getattr(_ROWS, "masks", None)
    mask_key = (tuple(present), rank, a.dtype)
    keep = masks.get(mask_key) if masks is not None else None
    if keep is None:
        block = {name: i for i, name in enumerate(present)}
        which = torch.tensor([block.get(name, -1) for name in adapter_names])
        keep = (which[:, None] == torch.arange(len(present))[None, :]).to(a.dtype).repeat_interleave(rank, dim=1)
        if masks is not None:
            masks[mask_key] = keep
    flat = x.to(a.dtype).reshape(x.shape[0], -1, x.shape[-1])  # (rows, tokens, in)
    lora = ((flat @ a.T) * keep[:, None, :]) @ b.T
    return result + lora.reshape(result.shape).to(result.dtype)


def _inject_adapter_names(module: Any, args: Any, kwargs: dict) -> Any:
    names = getattr(_ROWS, "names", None)
    if names is None:
        return None
    return args, {**kwargs, "adapter_names": names}


@contextmanager
def row_adapters(model: Any, adapters: list[str | None]) -> Iterator[None]:
    """Forwards of `model` inside the block run row i with adapter `adapters[i]` (None: the
    module as it is); nothing is set when every row runs the model's active adapter."""
    active = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None
    if all(a is None or a == active for a in adapters):
        yield
        return
    if active is None and any(a is None for a in adapters):
        raise ValueError("a mixed-adapter batch needs an adapter for every row")
    _ROWS.names = [a if a is not None else active for a in adapters]
    _ROWS.masks = {}  # `_stacked_mixed_forward`'s row masks, shared by the forward's layers
    try:
        yield
    finally:
        _ROWS.names = None
        _ROWS.masks = None
