"""One optimizer step over packed sequences, the same for every recipe (RL, SFT, DPO).

A recipe computes the loss of each packed sequence, calls `loss.backward()` and
`optimizer.step()` in its own code, inside `OptimizerStep.update`, which zeroes the gradients,
sets the precision and the role's adapter around each forward, clips, and lets the step happen
only when everything is finite. A step whose loss, a named loss term (KL, ...) or
gradient norm is NaN or inf is skipped with the weights untouched, counted
(`actor/nonfinite_steps`) and warned about; after `trainer.max_nonfinite_steps` such steps in
a row the run stops (`DivergedError`, exit 2) instead of writing NaN weights that fail later
with a misleading message.

With per-role LoRA adapters (`per_role_adapters`, `model.lora.per_role`) each packed sequence
holds one role's samples (`pack_samples(by_role=True)`) and is forwarded through that role's
adapter (`ajet.training.adapters.active_adapter`), so a role's samples update its adapter only.

`updating_weights(engine)` is the sequence around every in-process weight update: pause the
engine, drop its prefix cache (KV of the old weights) and its packed copy of the weights (packed
again from the new ones at its next forward), give freed memory back, update, bump the policy
version, all before the engine serves the next request.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ajet.config.schema import TrainerConfig
from ajet.context.pack import PackedSequence
from ajet.errors import DivergedError
from ajet.training.adapters import active_adapter
from ajet.training.memory import release_memory, step_heap_retention

if TYPE_CHECKING:
    from ajet.engine.local import LocalEngine
    from ajet.training.loop import TrainingLoop

log = logging.getLogger(__name__)

# The loss of one packed sequence, and its named terms to check for NaN/inf (e.g. {"kl": ...}).
SeqLoss = Callable[[PackedSequence], tuple[torch.Tensor, dict[str, float]]]


def resolve_bf16(setting: bool | None, model: torch.nn.Module) -> bool:
    """`trainer.bf16` as a yes or no: null = whether the model's device multiplies bf16 natively."""
    return setting if setting is not None else native_bf16(next(model.parameters()).device.type)


@functools.cache
def native_bf16(device_type: str) -> bool:
    """Whether a device of this type multiplies bf16 natively (a CUDA GPU with bf16; a CPU whose
    oneDNN has avx512_bf16 or AMX); asked, and logged, once a process."""
    if device_type == "cuda":
        native = bool(torch.cuda.is_bf16_supported())
    else:
        from ajet.engine.weights import has_bf16_gemm

        native = device_type == "cpu" and has_bf16_gemm()
    log.info("trainer.bf16 null: bf16 autocast %s on this %s (%s)", "on" if native else "off", device_type,
             "native bf16 matmuls" if native else "no native bf16 matmuls: fp32 is faster here")
    return native


def autocast(model: torch.nn.Module, bf16: bool) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on the model's device when `trainer.bf16`, else nothing."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16)


@dataclass
class StepResult:
    loss: float = 0.0  # summed over the packed sequences
    grad_norm: float = 0.0
    skipped: bool = False  # a non-finite term: the weights were not touched
    nonfinite: list[str] = field(default_factory=list)  # the terms that were not finite


class OptimizerStep:
    """One optimizer step at a time, in the recipe's own code:

        with optimizer_step.update(step) as update:    # gradients zeroed, the model in train mode
            for seq in packed:
                with update.forward(seq):               # the recipe's precision, the role's adapter
                    loss, terms = ...                   # the recipe's loss of one packed sequence
                if update.finite(loss, terms):
                    loss.backward()
            if update.clip_gradients():                 # all finite: the step may be applied
                optimizer.step()
                update.check_weights()
        update.result                                   # loss, gradient norm, skipped

    A step with a non-finite term is skipped and counted (`trainer.max_nonfinite_steps` in a row
    stop the run). `run` is that block for a recipe whose loss is a function of one sequence."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: TrainerConfig, *,
                 per_role_adapters: bool = False) -> None:
        self.model = model
        self.optimizer = optimizer
        self.per_role_adapters = per_role_adapters
        self.grad_clip = trainer.grad_clip
        self.bf16 = resolve_bf16(trainer.bf16, model)
        self.max_nonfinite = trainer.max_nonfinite_steps
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.on_begin: Callable[[], None] = lambda: None  # `keep_in`: the loop hears when an update begins
        self.heap_thresholds = (trainer.malloc_step_mmap_threshold_kb * 1024, trainer.malloc_mmap_threshold_kb * 1024)

    @contextlib.contextmanager
    def update(self, step: int | None = None) -> Iterator[Update]:
        """One update: gradients zeroed before and freed after, the model in train mode meanwhile;
        a skipped step is counted when the block ends (a `DivergedError` after too many in a row)."""
        self.on_begin()  # from here a stop waits for the update (ajet.training.loop)
        self.model.train()
        update = Update(self, step)
        try:
            with step_heap_retention(*self.heap_thresholds):
                self.optimizer.zero_grad(set_to_none=True)
                yield update
                # The gradients are spent (or poisoned): free them (as large as the weights) for
                # what runs until the next backward (rollout, evaluation, checkpoints).
                self.optimizer.zero_grad(set_to_none=True)
        finally:
            self.model.eval()
        self._account(update.result, step)

    def run(self, packed: list[PackedSequence], seq_loss: SeqLoss, *, step: int | None = None) -> StepResult:
        """One optimizer step over `packed` (sequences without trained entries are skipped), the loss
        of each sequence being `seq_loss(seq)`."""
        with self.update(step) as update:
            for seq in packed:
                if not seq.entry_pos:
                    continue
                with update.forward(seq):
                    loss, terms = seq_loss(seq)
                if update.finite(loss, terms):
                    loss.backward()
            if update.clip_gradients():
                self.optimizer.step()
                update.check_weights()
        return update.result

    def _adapter(self, seq: PackedSequence) -> contextlib.AbstractContextManager[None]:
        """The sequence's role adapter active for its forward (per-role adapters), else nothing.
        The backward may run outside: it follows the graph the forward built."""
        if not self.per_role_adapters:
            return contextlib.nullcontext()
        if not seq.role:
            raise ValueError("with per-role LoRA adapters every packed sequence holds one role's samples: "
                             "pack them with pack_samples(..., by_role=True)")
        return active_adapter(self.model, seq.role)

    def _account(self, result: StepResult, step: int | None) -> None:
        if not result.skipped:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_in_a_row += 1
        self.nonfinite_total += 1
        where = f"step {step}" if step is not None else "an update"
        terms = ", ".join(result.nonfinite)
        log.warning("%s: non-finite %s; the update was skipped and the weights are unchanged "
                    "(%d in a row, limit trainer.max_nonfinite_steps=%d)",
                    where, terms, self.nonfinite_in_a_row, self.max_nonfinite)
        if self.nonfinite_in_a_row >= self.max_nonfinite:
            raise DivergedError(
                f"{where}: {self.nonfinite_in_a_row} updates in a row had a non-finite {terms}; the "
                "training diverged. No non-finite update was applied: the weights are the last finished "
                "step's, and the run saves them as its checkpoint before it exits (the log says where). "
                "Try a lower trainer.lr, a cap on the importance ratio (algorithm.tis_cap, e.g. 2), or a "
                "tighter trainer.grad_clip, then --resume or start again.")

    def metrics(self) -> dict[str, float]:
        return {"actor/nonfinite_steps": float(self.nonfinite_total)}

    def state_dict(self) -> dict[str, int]:
        """The non-finite counters: a resumed run keeps counting towards max_nonfinite_steps."""
        return {"in_a_row": self.nonfinite_in_a_row, "total": self.nonfinite_total}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.nonfinite_in_a_row, self.nonfinite_total = int(state["in_a_row"]), int(state["total"])

    def keep_in(self, loop: TrainingLoop) -> None:
        """Checkpoint the counters with `loop`'s checkpoints, and tell `loop` when an update
        begins (before its first forward: a stop from there on lets the step finish)."""
        loop.keep("nonfinite_steps", self.state_dict, self.load_state_dict)
        self.on_begin = loop.update_begins


class Update:
    """The running update of `OptimizerStep.update`: what its block calls, in order."""

    def __init__(self, owner: OptimizerStep, step: int | None) -> None:
        self.owner = owner
        self.step = step
        self.result = StepResult()
        self._bad: set[str] = set()

    def forward(self, seq: PackedSequence) -> contextlib.AbstractContextManager[object]:
        """Around one sequence's forward: bf16 autocast (`trainer.bf16`) and the sequence's role
        adapter (per-role adapters). The backward runs outside: it follows the graph built here."""
        stack = contextlib.ExitStack()
        stack.enter_context(autocast(self.owner.model, self.owner.bf16))
        stack.enter_context(self.owner._adapter(seq))
        return stack

    def finite(self, loss: torch.Tensor, terms: dict[str, float]) -> bool:
        """Note the sequence's loss and named terms; whether its loss may be backpropagated (a
        non-finite loss would only spread NaN into the gradients). A non-finite term skips the step."""
        value = float(loss.detach())
        self._bad.update(name for name, term in terms.items() if not math.isfinite(term))
        if not math.isfinite(value):
            self._bad.add("loss")
            return False
        self.result.loss += value
        return True

    def clip_gradients(self) -> bool:
        """Clip the gradients to `trainer.grad_clip`; whether everything was finite, so the
        optimizer may step (else the step is skipped with the weights untouched)."""
        params = [p for p in self.owner.model.parameters() if p.requires_grad]
        self.result.grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.owner.grad_clip))
        if not math.isfinite(self.result.grad_norm):
            self._bad.add("gradient norm")
        if self._bad:
            self.result.skipped, self.result.nonfinite = True, sorted(self._bad)
        return not self._bad

    def check_weights(self) -> None:
        """After `optimizer.step()`: stop the run if the step left a non-finite weight."""
        check_finite(self.owner.model, self.step)


def check_finite(model: torch.nn.Module, step: int | None) -> None:
    """Stop the run (`DivergedError`) when an update left a non-finite trained weight, whatever
    its cause (finite gradients through a corrupt optimizer state, an overflow in the step)."""
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():
        # A NaN or inf makes its tensor's sum non-finite, and a sum is ~10x cheaper than isfinite
        # over 135M weights (27 vs 330 ms on 2 cores); only a non-finite sum (or an overflow of
        # finite weights) is looked at element by element.
        if not trained or bool(torch.stack([p.sum() for _, p in trained]).isfinite().all()):
            return
        bad = [name for name, p in trained if not bool(torch.isfinite(p).all())]
    if bad:
        where = f"step {step}" if step is not None else "an update"
        raise DivergedError(
            f"{where} left non-finite values in {len(bad)} trained weight tensor(s) (e.g. {bad[0]}): the run stops "
            "rather than train on or export them. They are not saved; the newest checkpoint on disk is the last "
            "good one. If it came from a resume, its optimizer state may be damaged: resume from the one before "
            "it (move the newest aside), or lower trainer.lr.")


@contextlib.contextmanager
def updating_weights(engine: LocalEngine) -> Iterator[None]:
    """The engine paused around a weight update; on success its policy version is bumped (inside
    the pause, so no request is prefilled between the update and the bump)."""
    with engine.paused():
        engine.drop_prefix_cache()  # KV of the old weights: invalid after the update, free it now
        engine.drop_weight_copy()  # stale after the update too: packed again at the next forward
        # What the rollout freed in small blocks (below trainer.malloc_mmap_threshold_kb) sits in
        # the engine thread's malloc arena, where the update cannot reuse it: give it back first.
        release_memory()
        yield
        engine.bump_version()


@contextlib.contextmanager
def overlapped_update(engine: LocalEngine) -> Iterator[None]:
    """A weight update while the engine keeps decoding on its own copy of the previous weights
    (`rollout.max_staleness`); on success the new weights are published (`publish_weights`:
    version bumped, the copy refreshed inside a short pause)."""
    yield
    engine.publish_weights()
