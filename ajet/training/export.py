"""A training checkpoint (`RUN/checkpoints/step_N/`) as a model that `ajet eval` and
`model.path` load: the checkpoint holds only what training changed (`weights.pt`: all weights,
or the LoRA adapters), so the run's `config.yaml` names the base and the LoRA settings, and the
result is written the way the run writes its `final_model/` (`save_final_model`), once, into
`step_N/model/`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ajet.config import load_config
from ajet.errors import ModelNotFoundError
from ajet.training.adapters import adapter_of
from ajet.training.checkpoint_dir import _COMPLETE, latest_checkpoint

log = logging.getLogger(__name__)

EXPORT_DIR = "model"


def training_checkpoint(path: str | Path) -> Path | None:
    """The complete training checkpoint `path` names: a `step_N/` directory (weights.pt), or a
    run's `checkpoints/` directory (its newest); None for anything else (a model directory).
    A half-written one is a `ModelNotFoundError`."""
    local = Path(path).expanduser()
    if (local / "weights.pt").is_file():
        if not (local / _COMPLETE).is_file():
            raise ModelNotFoundError(
                f"{path} is a training checkpoint that was never completed (no {_COMPLETE} marker: the run was "
                "killed while writing it); give an earlier step_N/ or the run's checkpoints/ directory (its newest)")
        return local
    if local.is_dir() and local.name == "checkpoints" and not (local / "config.json").is_file():
        newest = latest_checkpoint(local)
        if newest is None:
            raise ModelNotFoundError(f"{path} holds no complete checkpoint (step_N/ with {_COMPLETE}); "
                                     "the run saved none yet (trainer.save_every, or the end of the run)")
        return newest
    return None


def export_checkpoint(ckpt: Path) -> Path:
    """`ckpt/model/`: a Hugging Face checkpoint of training checkpoint `ckpt` (per-role LoRA:
    the base and `adapters/<role>/`, as a per-role run's final_model/). Made once; an existing
    complete export is returned as it is."""
    out = ckpt / EXPORT_DIR
    if (out / "config.json").is_file():
        return out
    config = ckpt.parent.parent / "config.yaml"
    if not config.is_file():
        raise ModelNotFoundError(
            f"{ckpt} is a training checkpoint, but its run directory ({ckpt.parent.parent}) has no config.yaml "
            "to name the base model and LoRA settings it was trained with; keep checkpoints/ inside its run directory")
    import torch

    from ajet.training.checkpoint import load_trainable_weights
    from ajet.training.model import load_trainable_model, save_final_model

    cfg = load_config(config, require_workflow=False)
    lora = cfg.model.lora
    roles = None
    if lora.enabled and lora.per_role:  # the adapters' names, in the order training made them
        names = torch.load(ckpt / "weights.pt", map_location="cpu", weights_only=True, mmap=True).keys()
        roles = list(dict.fromkeys(a for a in map(adapter_of, names) if a))
    log.info("exporting training checkpoint %s (base %s%s) to %s", ckpt, cfg.model.path,
             ", LoRA" if lora.enabled else "", out)
    model, tokenizer = load_trainable_model(cfg.model, seed=cfg.project.seed, trainable_targets=roles)
    load_trainable_weights(ckpt, model)
    save_final_model(model, tokenizer, out, lora=lora.enabled, per_role=lora.enabled and lora.per_role)
    return out
