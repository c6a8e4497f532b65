"""Load a causal LM and its tokenizer from the configured path: a Hugging Face checkpoint, or
a peft adapter directory merged into its base (`model_source`), e.g. one role's adapter of a
per-role run, `RUN/final_model/adapters/<role>`."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ajet.config.schema import ModelConfig
from ajet.errors import ModelNotFoundError
from ajet.models.resolve import resolve_model_path

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def model_source(cfg: ModelConfig) -> tuple[Path, Path | None]:
    """(the Hugging Face checkpoint to load, the peft adapter to merge into it, or None).

    `cfg.path` may be a peft adapter directory (adapter_config.json, no config.json). Its base
    is the checkpoint beside it when it is `<export>/adapters/<role>/` (a per-role run's
    final_model/ holds the base it trained on), else its `base_model_name_or_path`."""
    local = Path(cfg.path).expanduser()
    if not (local / "adapter_config.json").is_file() or (local / "config.json").is_file():
        return resolve_model_path(cfg.path, cfg.cache_dir), None
    export = local.parent.parent
    if local.parent.name == "adapters" and (export / "config.json").is_file():
        return export, local
    try:
        named = str(json.loads((local / "adapter_config.json").read_text()).get("base_model_name_or_path") or "")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise ModelNotFoundError(f"model.path={cfg.path}: cannot read its adapter_config.json ({exc})") from exc
    if not named:
        raise ModelNotFoundError(
            f"model.path={cfg.path} is a peft adapter that names no base model (base_model_name_or_path); "
            "set it in adapter_config.json, or give a merged checkpoint (model.lora.export_merged)")
    return resolve_model_path(named, cfg.cache_dir), local


def role_adapter_dir(path: str | Path, role: str) -> Path:
    """One role's adapter of a per-role run (`model.lora.per_role`): `<path>/adapters/<role>`,
    where `path` is the run's final_model/ (or the run directory holding it)."""
    root = Path(path).expanduser()
    if not (root / "adapters").is_dir() and (root / "final_model" / "adapters").is_dir():
        root = root / "final_model"
    adapters = root / "adapters"
    if not adapters.is_dir():
        raise ModelNotFoundError(
            f"--role {role}: {root} has no adapters/ directory; give --model the final_model/ of a run "
            "trained with model.lora.per_role=true (or its run directory)")
    if not (adapters / role / "adapter_config.json").is_file():
        roles = sorted(p.name for p in adapters.iterdir() if (p / "adapter_config.json").is_file())
        raise ModelNotFoundError(f"--role {role}: {adapters} has no adapter of role {role!r}; its roles: {roles}")
    return adapters / role


def role_adapter_dirs(path: str | Path) -> dict[str, Path]:
    """{role: adapter dir} of a per-role run's final_model/ (`<path>/adapters/<role>/`, beside
    the base's config.json), in name order; {} for any other directory."""
    root = Path(path).expanduser()
    adapters = root / "adapters"
    if not (root / "config.json").is_file() or not adapters.is_dir():
        return {}
    return {p.name: p for p in sorted(adapters.iterdir()) if (p / "adapter_config.json").is_file()}


def with_role_adapters(model: Any, adapters: dict[str, Path]) -> Any:
    """`model` (the base) as a peft model holding each role's adapter under the role's name, as
    training served them: a role plays its own adapter, "initial" the base without any."""
    from peft import PeftModel  # peft: heavy, only for a per-role run's adapters

    (first, first_dir), *rest = adapters.items()
    model = PeftModel.from_pretrained(model, first_dir, adapter_name=first)
    for role, directory in rest:
        model.load_adapter(directory, adapter_name=role)
    model.set_adapter(first)
    model.eval()
    log.info("loaded the role adapters %s", ", ".join(adapters))
    return model


def load_tokenizer(cfg: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_source(cfg)[0])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_and_tokenizer(cfg: ModelConfig) -> tuple[Any, Any]:
    """Return (model in eval mode on the configured device, tokenizer)."""
    from transformers import AutoModelForCausalLM

    path, adapter = model_source(cfg)
    device = pick_device(cfg.device)
    start = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(cfg.dtype, device))
    if adapter is not None:
        from peft import PeftModel  # a peft adapter directory only

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        path = adapter
    # transformers wraps PreTrainedModel.to with functools.wraps, which typeshed types as an unbound
    # callable (it wants `self` again); the call is Module.to's.
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    tokenizer = load_tokenizer(cfg)
    log.info("loaded %s on %s in %.2f s", path, device, time.monotonic() - start)
    return model, tokenizer
