"""The training side of `ajet tinker`: one peft model, one LoRA adapter per training client.

Every training client (`create_lora_training_client`) is an adapter named by its model id on one
shared frozen base, with its own AdamW. `forward_backward` runs the datums through that adapter
only (`ajet.training.adapters.active_adapter`) and accumulates into its gradients; `optim_step`
steps its optimizer, which holds its parameters and nothing else: another client's adapter gets
no gradient and no update, so it stays bit-identical.

The engine serves the same module (`ajet.engine.served_models`: a request's rows run with their
own adapter), so sampling a client's weights costs no copy, and the logprobs the engine records
are this model's. To make the adapters the engine can serve a fixed set of LoRA layers, the model
is wrapped at start with a placeholder adapter (`__slot__`, rank 1, B = 0: the base) over every
module a client may target (attention, MLP, unembedding): a later adapter adds its weights to
layers that exist, and the engine's row hooks are on all of them.

The caller (`ajet.tinker_service.service`) runs these methods one at a time on its worker
thread, with the engine paused, and bumps the engine's version after weights change.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ajet.tinker_service import losses
from ajet.tinker_service.errors import BadRequestError, NotFoundError
from ajet.tinker_service.wire import DatumIn, ForwardBackwardIn
from ajet.training.adapters import active_adapter, adapter_parameters

log = logging.getLogger(__name__)

SLOT = "__slot__"
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = ("lm_head",)


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    @property
    def targets(self) -> list[str]:
        return [*(ATTN if self.train_attn else ()), *(MLP if self.train_mlp else ()),
                *(UNEMBED if self.train_unembed else ())]


@dataclass
class _Client:
    spec: LoraSpec
    params: list[torch.nn.Parameter]  # the adapter's, in name order (the optimizer state's order)
    optimizer: torch.optim.AdamW


class LoraTrainer:
    def __init__(self, base: Any) -> None:
        from peft import LoraConfig, get_peft_model  # LoRA is what this service trains

        linears = {name.rsplit(".", 1)[-1] for name, module in base.named_modules()
                   if isinstance(module, torch.nn.Linear)}
        missing = sorted(set(ATTN + MLP + UNEMBED) - linears)
        if missing:
            raise BadRequestError(f"ajet tinker trains LoRA on {ATTN + MLP + UNEMBED}; this model has no {missing} "
                                  "linear layers (a Llama/Qwen-style model is needed)")
        slot = LoraConfig(r=1, lora_alpha=1, target_modules=list(ATTN + MLP + UNEMBED), init_lora_weights=True)
        self.model = get_peft_model(base, slot, adapter_name=SLOT)
        self.model.eval()
        self.model.requires_grad_(False)
        self.clients: dict[str, _Client] = {}

    # ------------------------------------------------------------------ adapters
    def create(self, name: str, spec: LoraSpec, seed: int | None = None) -> None:
        """A new adapter equal to the base (B = 0), trained by a fresh AdamW."""
        if not 1 <= spec.rank <= 256:
            raise BadRequestError(f"lora rank={spec.rank}: must be in [1, 256]")
        if not spec.targets:
            raise BadRequestError("LoRA needs at least one of train_mlp, train_attn, train_unembed")
        self._add_adapter(name, spec.rank, spec.alpha, spec.targets, seed)
        params = [p for _, p in sorted(adapter_parameters(self.model, name).items())]
        for p in params:
            p.requires_grad_(True)
        self.clients[name] = _Client(spec, params, torch.optim.AdamW(params, lr=1e-4, foreach=False))

    def _add_adapter(self, name: str, rank: int, alpha: int, targets: list[str], seed: int | None) -> None:
        from peft import LoraConfig

        if name in self.model.peft_config:
            raise BadRequestError(f"adapter {name!r} exists")
        # Seeded init of A (B is 0): the same seed gives the same adapter, without touching the
        # global RNG of whatever else runs in this process.
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.model.add_adapter(name, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets))
        self._settle()

    def client(self, name: str) -> _Client:
        client = self.clients.get(name)
        if client is None:
            raise NotFoundError(f"no training model {name!r} in this run of the service (models live until it "
                                "stops; after a restart, create a training client from a saved checkpoint)")
        return client

    def drop(self, name: str) -> None:
        """Unload an adapter (a training client's or a sampler's)."""
        self.clients.pop(name, None)
        if name in self.model.peft_config:
            self.model.delete_adapter(name)
            self._settle()

    def _settle(self) -> None:
        """The placeholder active, and only the training clients' parameters trainable (peft's
        add/set/delete_adapter change both)."""
        self.model.set_adapter(SLOT)
        self.model.requires_grad_(False)
        for client in self.clients.values():
            for p in client.params:
                p.requires_grad_(True)

    def copy_adapter(self, source: str, name: str) -> None:
        """A frozen copy of `source`'s current weights, named `name` (a sampler's snapshot)."""
        spec = self.client(source).spec
        self._add_adapter(name, spec.rank, spec.alpha, spec.targets, None)
        ours, theirs = adapter_parameters(self.model, name), adapter_parameters(self.model, source)
        with torch.no_grad():
            for key, param in ours.items():
                param.copy_(theirs[key.replace(f".{name}.", f".{source}.")])
                param.requires_grad_(False)

    # ------------------------------------------------------------------ training
    def forward_backward(self, request: ForwardBackwardIn) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum: the target tokens' logprobs (and the loss's gradient accumulated, unless
        `forward_only`). Metrics: `loss:sum` (and `clip_frac:mean` for ppo).

        Datums whose targets are their tokens shifted by one (every SDK recipe's) are tree-packed
        (`ajet.context.pack`): a group's shared prompt is forwarded once and many datums go through
        one forward of up to `PACK_TOKENS` positions; any other datum is forwarded alone."""
        self.client(request.model_id)  # 404 for an unknown model
        losses.check(request.loss_fn, request.config, request.data)
        data = request.data
        logprobs: dict[int, torch.Tensor] = {}  # datum index -> its target tokens' logprobs
        total, clip = 0.0, []

        def account(batch: list[int], new: list[torch.Tensor]) -> None:
            nonlocal total
            batch_losses = []
            for i, lp in zip(batch, new, strict=True):
                loss, metrics = losses.datum_loss(request.loss_fn, request.config, lp, data[i])
                batch_losses.append(loss)
                if "clip_frac" in metrics:
                    clip.append(metrics["clip_frac"])
                logprobs[i] = lp.detach()
            loss_sum = torch.stack(batch_losses).sum()
            if not request.forward_only:
                loss_sum.backward()
            total += float(loss_sum.detach())

        shifted: list[int] = []  # packed with others
        alone: list[int] = []  # forwarded on their own (targets not their tokens shifted)
        for i, datum in enumerate(data):
            (shifted if _shifted(datum) else alone).append(i)
        with active_adapter(self.model, request.model_id), torch.set_grad_enabled(not request.forward_only):
            for batch, new in _packed_logprobs(self.model, [data[i] for i in shifted]):
                account([shifted[k] for k in batch], new)
            for i in alone:
                account([i], [_datum_logprobs(self.model, data[i])])
        self._settle()  # active_adapter leaves every adapter trainable
        outputs = [{"logprobs": logprobs[i].numpy()} for i in range(len(data))]
        metrics_out = {"loss:sum": total}
        if clip:
            metrics_out["clip_frac:mean"] = float(np.mean(clip))
        return outputs, metrics_out

    def prompt_logprobs(self, adapter: str | None, tokens: list[int]) -> list[float]:
        """log p(token i | tokens before it) for i >= 1 under `adapter` (None: the base)."""
        ids = torch.tensor([tokens])
        with torch.no_grad():
            if adapter is None:
                with self.model.disable_adapter():
                    logits = self.model(input_ids=ids).logits[0].float()
            else:
                self.model.set_adapter(adapter)
                try:
                    logits = self.model(input_ids=ids).logits[0].float()
                finally:
                    self._settle()
        logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        return [float(x) for x in logprobs]

    def optim_step(self, name: str, adam: dict[str, float]) -> dict[str, float]:
        """One AdamW step with Tinker's `AdamParams`, then the gradients are zeroed."""
        client = self.client(name)
        grads = [p.grad for p in client.params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
            if grads else 0.0
        if adam["grad_clip_norm"] > 0 and grads:
            torch.nn.utils.clip_grad_norm_(client.params, adam["grad_clip_norm"])
        for group in client.optimizer.param_groups:
            group.update(lr=adam["learning_rate"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"],
                         weight_decay=adam["weight_decay"])
        client.optimizer.step()
        client.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm:mean": norm}

    # ------------------------------------------------------------------ files
    def save(self, name: str, directory: Path, optimizer: bool) -> None:
        """The adapter in peft's format (+ the optimizer state) into `directory`."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        client = self.client(name) if optimizer else None
        state = get_peft_model_state_dict(self.model, adapter_name=name)
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(directory / "adapter_model.safetensors"))
        config = copy.deepcopy(self.model.peft_config[name])
        config.base_model_name_or_path = str(getattr(self.model.base_model.model, "name_or_path", ""))
        config.save_pretrained(str(directory))
        if client is not None:
            torch.save(client.optimizer.state_dict(), directory / "optimizer.pt")

    def load(self, name: str, directory: Path, optimizer: bool) -> None:
        """Load a checkpoint's adapter (and optimizer state) into the existing adapter `name`."""
        from peft import LoraConfig, set_peft_model_state_dict
        from safetensors.torch import load_file

        client = self.client(name)
        saved = LoraConfig.from_pretrained(str(directory))
        if saved.r != client.spec.rank or set(saved.target_modules) != set(client.spec.targets):
            raise BadRequestError(f"the checkpoint has rank {saved.r} on {sorted(saved.target_modules)}; training model "
                                  f"{name!r} has rank {client.spec.rank} on {sorted(client.spec.targets)}")
        with torch.no_grad():
            result = set_peft_model_state_dict(self.model, load_file(str(directory / "adapter_model.safetensors")),
                                               adapter_name=name)
        unexpected = list(getattr(result, "unexpected_keys", None) or [])
        if unexpected:
            raise BadRequestError(f"checkpoint {directory.name}: tensors this adapter lacks: {unexpected[:3]}")
        if optimizer:
            if not (directory / "optimizer.pt").is_file():
                raise BadRequestError(f"checkpoint {directory.name} holds no optimizer state (a sampler checkpoint?)")
            client.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))

    def load_frozen(self, name: str, directory: Path) -> None:
        """A checkpoint's adapter as a new frozen adapter `name` (a sampler of a saved path)."""
        from peft import LoraConfig, set_peft_model_state_dict
        from safetensors.torch import load_file

        saved = LoraConfig.from_pretrained(str(directory))
        self._add_adapter(name, int(saved.r), int(saved.lora_alpha), sorted(saved.target_modules), None)
        with torch.no_grad():
            set_peft_model_state_dict(self.model, load_file(str(directory / "adapter_model.safetensors")),
                                      adapter_name=name)
        for param in adapter_parameters(self.model, name).values():
            param.requires_grad_(False)


# Positions of one packed forward: the activations of ~2k tokens of a laptop-sized model.
PACK_TOKENS = 2048


def _shifted(datum: DatumIn) -> bool:
    """Whether the datum's targets are its tokens shifted by one (then tokens + the last target
    is one sequence, and the datum can share a packed forward)."""
    targets = np.asarray(datum.inputs["target_tokens"]).astype(np.int64)
    return bool(np.array_equal(targets[:-1], np.asarray(datum.tokens[1:], dtype=np.int64)))


def _datum_logprobs(model: Any, datum: DatumIn) -> torch.Tensor:
    """log p(target i | tokens[:i + 1]) of one datum, from its own forward."""
    targets = torch.as_tensor(np.asarray(datum.inputs["target_tokens"], dtype=np.int64))
    logits = model(input_ids=torch.tensor([datum.tokens])).logits[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]


def _packed_logprobs(model: Any, data: list[DatumIn]) -> Iterator[tuple[list[int], list[torch.Tensor]]]:
    """For each packed forward: the indices (into `data`) of its datums and each one's target
    logprobs, in the datum's order. The values are each datum's own forward's, up to float
    summation order (tests/unit/test_context_lossless.py holds the packed forward to that)."""
    from ajet.context.pack import pack_samples
    from ajet.context.types import Sample
    from ajet.forward.packed import forward_packed

    samples, weights = [], []
    for datum in data:
        ids = [*datum.tokens, int(np.asarray(datum.inputs["target_tokens"])[-1])]
        samples.append(Sample(input_ids=ids, loss_mask=[0] + [1] * len(datum.tokens), old_logprobs=[0.0] * len(ids)))
        weights.append([1.0] * len(ids))
    for packed in pack_samples(samples, weights, PACK_TOKENS):
        entry_logprobs, _ = forward_packed(model, packed, logits_chunk=256)
        batch = sorted(set(packed.entry_sample))
        owner = torch.tensor(packed.entry_sample)
        # Entries are laid out sample by sample, each in its token order.
        yield batch, [entry_logprobs[owner == i] for i in batch]


def spec_of(directory: Path) -> LoraSpec:
    """The LoRA settings a checkpoint was saved with."""
    from peft import LoraConfig

    saved = LoraConfig.from_pretrained(str(directory))
    targets = set(saved.target_modules)
    return LoraSpec(int(saved.r), int(saved.lora_alpha), train_mlp=bool(targets & set(MLP)),
                    train_attn=bool(targets & set(ATTN)), train_unembed=bool(targets & set(UNEMBED)))
