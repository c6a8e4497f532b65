"""The model a recipe trains: loaded from `model.path`, with LoRA when enabled, and saved at the end.

Full fine-tuning or a peft LoRA adapter from `model.lora` (peft is imported only when LoRA
is on); with `model.lora.per_role`, one adapter per trainable role, named by the role, on one
shared base. The final model is a plain Hugging Face checkpoint, written atomically.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

from ajet.config.schema import LoraConfig, ModelConfig
from ajet.errors import ConfigError, DiskFullError
from ajet.files import free_mib, is_disk_full
from ajet.models.load import load_model_and_tokenizer
from ajet.training.adapters import role_adapters
from ajet.training.checkpoint_dir import MAKE_ROOM

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# What a recipe trains: the transformers model, or the peft model that wraps it (`model.lora`).
TrainableModel: TypeAlias = "PreTrainedModel | PeftModel"


def load_trainable_model(cfg: ModelConfig, *, seed: int, gradient_checkpointing: bool = False,
                         keep_matmuls: bool = False,
                         trainable_targets: list[str] | None = None) -> tuple[TrainableModel, PreTrainedTokenizerBase]:
    """(model in eval mode, tokenizer); a peft model when `cfg.lora.enabled`.

    `trainable_targets`: the run's trainable roles (`ajet.rollout.workflow_loader.trainable_targets_of`). With
    `cfg.lora.per_role` each gets its own adapter named by the role (the same LoraConfig, peft's
    default init: each starts equal to the base); the first is the active one (what the engine
    serves for `model=None`), and every adapter's parameters require grad (the update selects
    the adapter of each packed sequence, with all of them in the optimizer). `keep_matmuls`: with
    `gradient_checkpointing`, `trainer.checkpoint_keep_matmuls` (`enable_activation_checkpointing`)."""
    import torch

    adapters = per_role_adapters(cfg.lora, trainable_targets) if cfg.lora.enabled else []
    torch.manual_seed(seed)
    base: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    base, tokenizer = load_model_and_tokenizer(cfg)  # Any: what transformers' Auto classes load
    model: TrainableModel = base
    if cfg.lora.enabled:
        from peft import LoraConfig as PeftLoraConfig  # LoRA runs only
        from peft import get_peft_model

        lora = cfg.lora
        config = PeftLoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config, adapter_name=adapters[0])
        for role in adapters[1:]:
            model.add_adapter(role, copy.deepcopy(config))
        # peft leaves only the active adapter trainable; the update trains every role's.
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.requires_grad_(True)
        if len(adapters) > 1:
            log.info("one LoRA adapter per trainable role: %s", ", ".join(adapters))
        model.eval()
    if gradient_checkpointing:
        enable_activation_checkpointing(model, keep_matmuls=keep_matmuls)
    return model, tokenizer


def per_role_adapters(lora: LoraConfig, trainable_targets: list[str] | None) -> list[str]:
    """The LoRA adapters' names: one per role with `lora.per_role`, else peft's "default".
    ConfigError when per_role has no trainable role to give an adapter to."""
    if not lora.per_role:
        return ["default"]
    names = list(dict.fromkeys(trainable_targets or []))
    if not names:
        raise ConfigError(
            "model.lora.per_role=true gives each trainable role its own LoRA adapter, but this run names "
            "no trainable role (workflow.trainable_targets is empty and the workflow class sets no "
            "trainable_targets). List the roles to train, e.g. workflow.trainable_targets=[wolf,seer], or "
            "set model.lora.per_role=false to train one adapter for every role")
    bad = [name for name in names if not name or "." in name or name == "__base__"]
    if bad:
        raise ConfigError(f"trainable role(s) {bad} cannot name a LoRA adapter (model.lora.per_role): a name "
                          "must be non-empty, without '.', and not '__base__'; rename the role")
    return names


def enable_activation_checkpointing(model: TrainableModel, *, keep_matmuls: bool = False) -> None:
    """Recompute each decoder layer in backward (`trainer.gradient_checkpointing`).

    Non-reentrant checkpointing: it works whether or not the inputs need grad (LoRA freezes the
    embeddings) and is what torch recommends. The model recomputes only in train mode: the
    engine's eval-mode decoding is unchanged.

    `keep_matmuls` (`trainer.checkpoint_keep_matmuls`): keep the outputs of the layer's fp32
    matmuls that read its hidden state and of its attention (`KeepMatmuls`), and recompute only
    the rest; False: recompute whole layers."""
    kwargs: dict[str, object] = {"use_reentrant": False}
    if keep_matmuls:
        hidden = int(getattr(model.config, "hidden_size", 0) or 0)
        if not hidden:
            raise ConfigError(f"trainer.checkpoint_keep_matmuls=true: {type(model).__name__}'s config has no "
                              "hidden_size, so the matmuls that read the hidden state cannot be told apart; set it "
                              "to false")
        kwargs["context_fn"] = KeepMatmuls(hidden).contexts
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class KeepMatmuls:
    """A selective activation checkpointing policy (`torch.utils.checkpoint`): inside a
    checkpointed layer, the output of every matmul whose input is `hidden` wide (a Llama-style
    layer's q, k, v, o, gate and up projections; a LoRA adapter's A) and of the attention kernel
    is kept, so the recompute in backward skips those GEMMs and the attention's forward and
    redoes only the rest: the norms, RoPE, SiLU and the down projection (whose input the backward
    needs anyway). Exact: a kept output is the forward's own tensor.

    Only fp32 ones. Under autocast a layer is checkpointed whole, without the policy: there the
    GEMMs are the cheap part of the recompute (make demo's bf16 SFT step on the AMD avx512_bf16
    type: 6.14 s whole-layer, 6.09 s with the matmuls kept, noise ~0.3 s), and the policy's
    dispatch on every op cost ~5 % when it kept nothing (6.38 against 6.72 s, median of 7)."""

    ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")

    def __init__(self, hidden: int) -> None:
        import torch
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        self.hidden = hidden
        self.selective = create_selective_checkpoint_contexts
        self.autocast_enabled = torch.is_autocast_enabled
        aten = torch.ops.aten
        self.mm, self.addmm, self.fp32 = aten.mm.default, aten.addmm.default, torch.float32
        self.attention = {getattr(aten, name).default for name in self.ATTENTION if hasattr(aten, name)}
        self.keep, self.recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE

    def contexts(self) -> tuple[contextlib.AbstractContextManager[object], contextlib.AbstractContextManager[object]]:
        """`torch.utils.checkpoint`'s context_fn, called as each layer's forward starts: the
        policy's contexts, or none under autocast (a whole-layer recompute)."""
        if self.autocast_enabled("cpu") or self.autocast_enabled("cuda"):
            return contextlib.nullcontext(), contextlib.nullcontext()
        forward, recompute = self.selective(self)
        return forward, recompute

    def __call__(self, ctx: object, op: object, *args: torch.Tensor, **kwargs: object) -> object:
        """Per op of a checkpointed layer's forward (and again in its recompute): keep or recompute.
        (An op's other arguments are not all tensors; only the matched ops' first three are read.)"""
        if op is self.mm:
            x, weight = args[0], args[1]
        elif op is self.addmm:
            x, weight = args[1], args[2]
        elif op in self.attention:
            x = weight = args[0]  # the query
        else:
            return self.recompute
        wide = weight is x or (weight.dim() == 2 and weight.shape[0] == self.hidden)
        return self.keep if wide and x.dtype == self.fp32 else self.recompute


def model_window(model: torch.nn.Module, configured: int) -> int:
    return configured or int(getattr(model.config, "max_position_embeddings", 0) or 4096)


def save_final_model(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None, out: Path, *, lora: bool,
                     per_role: bool = False,
                     export_merged: bool = False) -> Path:
    """A plain Hugging Face checkpoint (a LoRA adapter is merged into a copy first), written
    atomically: into a temporary directory beside `out`, then renamed, so a kill mid-write
    never leaves a half `final_model/` (an earlier one is replaced only once the new one is whole).

    Per-role adapters (`per_role`, `model.lora.per_role`): `out` holds the base (never trained,
    so `--model final_model` is the starting point) and each role's adapter in peft format under
    `adapters/<role>/` (`ajet eval --model final_model/adapters/<role>`, or `--role <role>`);
    `export_merged` (`model.lora.export_merged`) adds each role's adapter merged into a copy of
    the base, a plain checkpoint under `merged/<role>/`."""
    import shutil
    import tempfile

    if tokenizer is None:  # a loop attached without one (tests of the loop alone)
        raise ValueError(f"{out} is written with the model's tokenizer: attach one to the training loop")
    # With LoRA (`lora`, `per_role`) `model` is load_trainable_model's peft model, else the transformers one.
    plain: PreTrainedModel | None = None  # one plain checkpoint; None: the per-role layout
    if not per_role:
        plain = copy.deepcopy(cast("PeftModel", model)).merge_and_unload() if lora else cast("PreTrainedModel", model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        if plain is None:
            _save_role_adapters(cast("PeftModel", model), tokenizer, tmp, merged=export_merged)
        else:
            plain.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        if out.exists():
            old = out.with_name(f".old-{out.name}")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc):
            raise DiskFullError(
                f"the final model could not be written to {out}: no space left on device ({free_mib(out.parent):.0f} "
                f"MiB free there). The run's checkpoints are intact: {MAKE_ROOM}, then rerun with --resume, "
                "which continues from the newest checkpoint and writes the final model.") from exc
        raise
    log.info("final model saved to %s", out)
    return out


def _save_role_adapters(model: PeftModel, tokenizer: PreTrainedTokenizerBase, out: Path, *, merged: bool) -> None:
    """The base, `adapters/<role>/` (peft format) per role and, with `merged`, `merged/<role>/`."""
    import shutil

    base: PreTrainedModel = copy.deepcopy(model).unload()  # the base without any adapter (peft's: untyped)
    base.save_pretrained(out)
    del base  # a whole copy of the weights: gone before the adapters' copies are made
    tokenizer.save_pretrained(out)
    for role in role_adapters(model):
        stage = out / f".stage-{role}"
        model.save_pretrained(str(stage), selected_adapters=[role])  # peft's types say str; a Path is the same
        # peft writes an adapter other than "default" into a subdirectory named after it
        (stage if role == "default" else stage / role).rename(_role_dir(out / "adapters", role))
        shutil.rmtree(stage, ignore_errors=True)
        if merged:
            one: PreTrainedModel = copy.deepcopy(model).merge_and_unload(adapter_names=[role])  # untyped, as above
            one.save_pretrained(_role_dir(out / "merged", role))
            tokenizer.save_pretrained(out / "merged" / role)
            del one
    log.info("final model: the base, %d role adapters%s", len(role_adapters(model)), " (and merged)" if merged else "")


def _role_dir(parent: Path, role: str) -> Path:
    """`parent/role`, refusing a role name that is not one directory name."""
    if role in (".", "..") or Path(role).name != role:
        raise ValueError(f"role {role!r} cannot name a directory of final_model/; use a role name without '/'")
    parent.mkdir(parents=True, exist_ok=True)
    return parent / role
