"""The KL reference policy: what `ref_logprobs` are computed with.

- `frozen`: a deep copy of the model taken at construction (build it before the first
  update), in eval mode, gradients off. Costs one more copy of the weights.
- `lora_base`: the trained model itself with its LoRA adapters disabled (peft's
  `disable_adapter()`): the base weights never change under LoRA, so they are the
  initial policy, at no memory cost.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar, cast

from ajet.algorithms.options import ReferenceModel

if TYPE_CHECKING:
    from torch import nn

    from ajet.config.schema import AlgorithmConfig

logger = logging.getLogger(__name__)



REFERENCE_KINDS = tuple(kind.value for kind in ReferenceModel)
T = TypeVar("T")
P = ParamSpec("P")


class ReferencePolicy:
    """Computes reference log-probs with `forward_fn(model, ...)` under `torch.no_grad()`."""

    def __init__(self, model: nn.Module, kind: str | ReferenceModel = "frozen") -> None:
        if kind not in REFERENCE_KINDS:
            raise ValueError(
                f"algorithm.kl_reference={kind!r} unknown; use one of {REFERENCE_KINDS}"
            )
        kind = ReferenceModel(kind).value
        self.kind = kind
        if kind == "frozen":
            self._model = copy.deepcopy(model)
            self._model.eval()
            self._model.requires_grad_(False)
        else:
            if not callable(getattr(model, "disable_adapter", None)):
                raise ValueError(
                    "algorithm.kl_reference=lora_base needs a LoRA (peft) model; enable "
                    "model.lora.enabled or set algorithm.kl_reference=frozen"
                )
            self._model = model

    @contextmanager
    def model(self) -> Iterator[nn.Module]:
        """The reference model, in eval mode, for the duration of the block."""
        if self.kind == "frozen":
            yield self._model
            return
        was_training = self._model.training
        self._model.eval()  # no dropout in the reference forward
        try:
            # peft's (checked in __init__); nn.Module's __getattr__ types it as a tensor or a module.
            disable_adapter = cast("Callable[[], AbstractContextManager[None]]", self._model.disable_adapter)
            with disable_adapter():  # the base weights alone
                yield self._model
        finally:
            self._model.train(was_training)

    def ref_logprobs(self, forward_fn: Callable[Concatenate[nn.Module, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`forward_fn(reference_model, *args, **kwargs)` without gradients."""
        import torch

        with torch.no_grad(), self.model() as ref_model:
            return forward_fn(ref_model, *args, **kwargs)


def build_reference(model: nn.Module, config: AlgorithmConfig) -> ReferencePolicy | None:
    """The reference the algorithm config asks for; None when `kl_coef == 0` (no KL term)."""
    if config.kl_coef == 0:
        return None
    logger.info("KL reference policy: %s (kl_coef=%g)", ReferenceModel(config.kl_reference).value, config.kl_coef)
    return ReferencePolicy(model, config.kl_reference)
