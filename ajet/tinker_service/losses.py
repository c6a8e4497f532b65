"""The Tinker SDK's built-in losses (`tinker.types.LossFnType`) on ajet's own
(`ajet.algorithms.losses`). Every loss is a sum over a datum's tokens, summed over the data,
as Tinker's: a script normalises through its `weights` / `advantages`.

| loss_fn               | ajet                                                          |
|-----------------------|---------------------------------------------------------------|
| `cross_entropy`       | `sft_loss(logprobs, weights)`: `-sum(weights * logprobs)`     |
| `importance_sampling` | `policy_loss` unclipped: `-sum(exp(logprobs - old) * A)`      |
| `ppo`                 | `policy_loss(clip_low=1 - low, clip_high=high - 1)`, the thresholds from `loss_fn_config` (`clip_low_threshold` 0.8, `clip_high_threshold` 1.2 by default) |

`cispo`, `dro`, `gspo`, `stable_reinforce` and a server-side `custom` loss have no counterpart
in ajet and are refused by name (the SDK's `forward_backward_custom` runs the custom loss on the
client over `cross_entropy`, so it works). Log-ratios are clamped to [-20, 20] before `exp`, as
everywhere in ajet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ajet.algorithms.losses import policy_loss, sft_loss
from ajet.tinker_service.errors import BadRequestError, NotServedError
from ajet.tinker_service.wire import DatumIn

SERVED = ("cross_entropy", "importance_sampling", "ppo")
_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
}
_OPTIONAL = {"cross_entropy": ("weights",)}  # all ones when absent
_CONFIG = {"ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}}


def check(loss_fn: str, config: dict[str, float | str], data: Sequence[DatumIn]) -> None:
    """Refuse (before any work) a loss that is not served, an unknown config key, a datum without
    an input its loss needs or with one it does not read, or inputs of the wrong length."""
    if loss_fn not in SERVED:
        raise NotServedError(f"loss_fn={loss_fn!r}", f"served: {', '.join(SERVED)}")
    unknown = sorted(set(config) - set(_CONFIG.get(loss_fn, {})))
    if unknown:
        known = sorted(_CONFIG.get(loss_fn, {})) or "none"
        raise NotServedError(f"loss_fn_config {unknown} for loss_fn={loss_fn!r}", f"it takes {known}")
    if not data:
        raise BadRequestError("forward_backward: no data")
    needed, optional = _INPUTS[loss_fn], _OPTIONAL.get(loss_fn, ())
    for i, datum in enumerate(data):
        missing = [k for k in needed if k not in datum.inputs and k not in optional]
        extra = sorted(set(datum.inputs) - set(needed))
        if missing:
            raise BadRequestError(f"datum {i}: loss_fn={loss_fn!r} needs loss_fn_inputs {missing}")
        if extra:
            raise NotServedError(f"loss_fn_inputs {extra} for loss_fn={loss_fn!r} (datum {i})", f"it reads {list(needed)}")
        for name, array in datum.inputs.items():
            if array.shape != (len(datum.tokens),):
                raise BadRequestError(f"datum {i}: loss_fn_inputs[{name!r}] has shape {list(array.shape)}; "
                                      f"it needs one value per model_input token ({len(datum.tokens)})")
        if not datum.tokens:
            raise BadRequestError(f"datum {i}: empty model_input")


def datum_loss(loss_fn: str, config: dict[str, float | str], logprobs: Tensor, datum: DatumIn
               ) -> tuple[Tensor, dict[str, float]]:
    """One datum's loss (a scalar with the graph) from its target tokens' new `logprobs`."""
    def given(name: str) -> Tensor:
        return torch.as_tensor(np.asarray(datum.inputs[name], dtype=np.float32))

    if loss_fn == "cross_entropy":
        weights = given("weights") if "weights" in datum.inputs else torch.ones_like(logprobs)
        return sft_loss(logprobs, weights), {}
    ones = torch.ones_like(logprobs)
    if loss_fn == "importance_sampling":
        return policy_loss(logprobs, given("logprobs"), given("advantages"), ones, clip_low=1.0, clip_high=math.inf)
    settings = {**_CONFIG["ppo"], **config}
    low, high = float(settings["clip_low_threshold"]), float(settings["clip_high_threshold"])
    if not 0.0 <= low <= 1.0 <= high:
        raise BadRequestError(f"ppo: need 0 <= clip_low_threshold <= 1 <= clip_high_threshold, got {low}, {high}")
    return policy_loss(logprobs, given("logprobs"), given("advantages"), ones, clip_low=1.0 - low, clip_high=high - 1.0)
