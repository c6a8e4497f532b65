"""How the model learns: sampling episodes (`rollout`), their token budgets (`context`), the RL
algorithm (`algorithm`) and on-policy distillation's teacher (`distill`); and supervised
fine-tuning on dialogs (`sft`).

Part of the one schema (`ajet.config.schema` re-exports them; defaults live here and nowhere else)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from annotated_types import Ge, Gt, Interval

from ajet.config.choices import (
    DpoLoss,
    EngineDType,
    LossAgg,
    OverflowPolicy,
    ReferenceModel,
    StepCredit,
    ToolCallGrammar,
)
from ajet.config.ranges import bounded


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
