"""AdamW whose two moments are stored in bfloat16 (`trainer.optimizer_state_dtype: bfloat16`).

fp32 AdamW keeps two fp32 tensors per parameter: for the bundled 135M model 1.08 GB, as much
as the weights and the gradients together. Stored in bf16 they take half (0.54 GB). The
arithmetic stays fp32: each step widens a slice of the moments to fp32, updates it exactly as
`torch.optim.AdamW` does (decoupled weight decay, bias correction, `eps` outside the square
root), and stores it back. Parameters are processed `_SLICE` elements at a time, so the fp32
temporaries are a few tens of MB whatever the parameter's size (the embedding is 113 MB).

Storing rounds with **stochastic rounding** (round up with probability equal to the dropped
fraction): round-to-nearest would lose the second moment's small updates, `(1 - beta2) * g^2`
is 0.1% of the value while bf16 keeps 8 bits (0.4%), so a plain bf16 moment stops following
the gradients after a few hundred steps. Stochastic rounding is unbiased: the stored moment
equals the fp32 one in expectation. The random bits come from a generator seeded once
(`seed`), so a run is repeatable; a resumed run draws other bits than an uninterrupted one.

This changes numerics (the moments carry ~3 significant digits); the weights, gradients and
the update itself stay fp32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

# Elements per slice of a parameter: 4M fp32 = 16 MB per temporary.
_SLICE = 1 << 22


class BF16StateAdamW(torch.optim.Optimizer):
    """`torch.optim.AdamW` (no amsgrad, no maximize) with `exp_avg` and `exp_avg_sq` in bf16."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, seed: int = 0) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"invalid AdamW hyperparameters: lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self._seed = seed
        self._generator: torch.Generator | None = None

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN201 - torch's overloaded signature
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group["lr"], group["betas"], group["eps"], group["weight_decay"])
        return loss

    def _update(self, p: torch.Tensor, lr: float, betas: tuple[float, float], eps: float,
                weight_decay: float) -> None:
        grad = p.grad
        assert grad is not None  # `step` updates only parameters with a gradient
        if grad.is_sparse:
            raise RuntimeError("BF16StateAdamW does not support sparse gradients")
        state = self.state[p]
        if not state:
            # `step` as a tensor, as torch.optim.AdamW keeps it: checkpoints look alike.
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16, memory_format=torch.contiguous_format)
        state["step"] += 1
        step = int(state["step"].item())
        beta1, beta2 = betas
        step_size = lr / (1 - beta1 ** step)
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** step)
        flat_p, flat_g = _flat(p), _flat(grad)
        flat_m, flat_v = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
        for start in range(0, flat_p.numel(), _SLICE):
            part = slice(start, start + _SLICE)
            param, grad = flat_p[part], flat_g[part].float()
            if weight_decay:
                param.mul_(1 - lr * weight_decay)
            m = flat_m[part].float().lerp_(grad, 1 - beta1)
            v = flat_v[part].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
            param.addcdiv_(m.to(param.dtype), denom.to(param.dtype), value=-step_size)
            flat_m[part] = self._round(m)
            flat_v[part] = self._round(v)

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """torch casts loaded state to each parameter's dtype; the moments go back to bf16 (a
        checkpoint of fp32 AdamW loads too)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)

    def _round(self, x: torch.Tensor) -> torch.Tensor:
        if self._generator is None or self._generator.device != x.device:
            self._generator = torch.Generator(device=x.device)
            self._generator.manual_seed(self._seed)
        return stochastic_round_bf16(x, self._generator)


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 -> bf16, rounding up (away from zero) with probability equal to the fraction dropped.

    bf16 is the top 16 bits of fp32: adding a uniform random 16-bit integer to the fp32 bit
    pattern and truncating the low 16 bits carries into the kept bits with exactly that
    probability (the bits are sign and magnitude, so this works for negative values too)."""
    bits = x.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=x.device, generator=generator)
    rounded = (bits + noise).bitwise_and_(-65536)  # 0xFFFF0000: drop the low 16 bits
    return rounded.view(torch.float32).to(torch.bfloat16)  # exact: the low bits are 0


def _flat(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise RuntimeError("BF16StateAdamW needs contiguous parameters and gradients")
    return t.view(-1)
