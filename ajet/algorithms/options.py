"""The algorithms' own config choices (`algorithm.dpo_loss`, `algorithm.kl_reference`,
`algorithm.dpo_reference`), re-exported by `ajet.config.choices`. Imports nothing: the config's
schema reads it, and the context layer, which must not reach torch, reads the schema."""

from __future__ import annotations

from enum import Enum


class DpoLoss(str, Enum):
    """`algorithm.dpo_loss` (ajet/algorithms/dpo.py)."""

    sigmoid = "sigmoid"
    hinge = "hinge"
    ipo = "ipo"


class ReferenceModel(str, Enum):
    """The reference policy of a KL penalty or of DPO (ajet/algorithms/reference.py)."""

    frozen = "frozen"  # a frozen copy of the initial model
    lora_base = "lora_base"  # the same model with its LoRA adapter disabled (needs model.lora)
