"""The sections around the tasks: where they come from (`task_reader`, or an environment of the
ecosystem: `env`), how an episode is scored when the workflow returns no reward (`judge`), and
what an evaluation runs (`eval`).

Part of the one schema (`ajet.config.schema` re-exports them; defaults live here and nowhere else)."""

from __future__ import annotations

from dataclasses import dataclass, field

from annotated_types import Ge, Gt, Interval

from ajet.config.choices import EnvType, EvalSplit, OnError, PassOver, ReaderType
from ajet.config.ranges import bounded


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
class TaskSelectionConfig:
    # Rollouts where they teach (ajet/task_reader/selection.py): pass over a train task whose
    # last `window` groups (at least `min_seen` of them) all passed or all failed, until
    # `revisit_epochs` epochs after it was last drawn. An episode passes when it is a success (its
    # is_success; without one, a reward >= 1). Its metrics: reader/selection_skipped,
    # reader/settled_share. Not with a curriculum; debug backbone only.
    enabled: bool = False
    window: int = bounded(2, Ge(1))
    min_seen: int = bounded(2, Ge(1))
    revisit_epochs: int = bounded(3, Ge(1))
    # Which settled tasks it passes over: both (all passed or all failed), only the `solved`
    # ones (a task never solved is drawn again: a policy that improves may reach it now), or
    # only the `failed` ones.
    pass_over: PassOver = PassOver.both


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
    selection: TaskSelectionConfig = field(default_factory=TaskSelectionConfig)


# A split's k-th task is built from seed `env.seed + split * SPLIT_SEED_STRIDE + k` (train 0, val 1,
# test 2): no two splits share a seed while each holds fewer tasks than the stride.
SPLIT_SEED_STRIDE = 1_000_000


@dataclass
class ReasoningGymEnvConfig:
    # The system prompt: a name in reasoning_gym.utils.SYSTEM_PROMPTS (default, DeepSeekZero,
    # simple, direct, chain_of_draft) or the text itself. The user turn is the dataset's question.
    system_prompt: str = "default"
    # The answer is the text in the reply's last <answer_tag>...</answer_tag>, extracted by
    # reasoning_gym.utils.extract_answer, and scored by the dataset's own score_answer.
    answer_tag: str = "answer"
    # A reply without the tag: false = scores 0 (reasoning-gym's own rule: the format counts);
    # true = the whole reply is scored (score_answer gives partial credit when the answer is in it).
    score_untagged_reply: bool = False
    # reasoning-gym's curriculum for the dataset (its *Curriculum class), as levels of ajet's
    # curriculum: 0 = none (the dataset under env.args); K = each split's tasks come evenly from its
    # global levels 0..K-1 (the curriculum's config at that level over env.args), and each task's
    # metadata holds `curriculum_level`, so `task_reader.curriculum.key: curriculum_level` draws
    # the low levels first.
    curriculum_levels: int = bounded(0, Ge(0))


@dataclass
class GymnasiumEnvConfig:
    # The actions' names, in the action space's order (e.g. [left, down, right, up]); [] = from the
    # environment's docstring ("- 0: Move left"), else their numbers. A reply names one of them.
    actions: list[str] = field(default_factory=list)
    # "package.module:function" or "file.py:function" (relative to the YAML), called as
    # function(observation, env) -> str; "" = the env's ansi render (coloured cells in [brackets]:
    # FrozenLake's player), or the observation itself when the env has no ansi render.
    renderer: str = ""
    # "package.module:function" or "file.py:function", called as function(seed) -> dict: gym.make's
    # keyword arguments of the task with that seed, over env.args (e.g. FrozenLake's `desc`, a map of
    # the seed's own, so that val and test hold maps training never saw); "" = env.args alone.
    task_args: str = ""
    # "" = one that names the environment, its actions and the answer's form.
    system_prompt: str = ""


@dataclass
class VerifiersEnvConfig:
    # The server of verifiers' environment (ajet/envs/verifiers_server.py): "" = the launcher
    # starts it (`ajet train`) on 127.0.0.1:port with `python` (verifiers pins clash with ajet's:
    # `make env-verifiers` builds .venv-verifiers); else the URL of one already running.
    url: str = ""
    python: str = ".venv-verifiers/bin/python"
    port: int = bounded(8791, Interval(ge=1, le=65535))
    # The taskset's config for val and test (e.g. {split: test}), over env.args; {} = val and
    # test are the taskset's next tasks after train's.
    eval_args: dict = field(default_factory=dict)
    # Seconds a request to the server may take (a tool call, the scoring).
    timeout_s: float = bounded(120.0, Gt(0))


@dataclass
class OpenEnvEnvConfig:
    # An OpenEnv server: "" = the launcher starts `app` (its ASGI app, "package.module:app") under
    # uvicorn on 127.0.0.1:port with `python` (openenv-core's pins clash with ajet's: `make
    # env-openenv` builds .venv-openenv), and restarts it if it dies; else the URL of one running.
    url: str = ""
    app: str = ""
    python: str = ".venv-openenv/bin/python"
    port: int = bounded(8792, Interval(ge=1, le=65535))
    # The action's field the reply's text fills ("" = the action schema's only string field;
    # none or several: the reply is the action as a JSON object).
    action_field: str = ""
    # The observation's field the model reads ("" = the whole observation as JSON).
    observation_field: str = ""
    # "" = one that names the environment and the action's form.
    system_prompt: str = ""
    # Seconds to connect and to wait for each answer.
    timeout_s: float = bounded(60.0, Gt(0))


@dataclass
class EnvConfig:
    # An environment that gives the tasks, the workflow and the reward (docs/environments.md):
    # none, reasoning_gym, gymnasium, verifiers or openenv. With one set, the YAML needs no task file (task_reader.type
    # becomes env) and no workflow (workflow.target becomes ajet.envs.<type>:EnvWorkflow).
    type: EnvType = EnvType.none
    # reasoning_gym: a dataset name (basic_arithmetic, chain_sum, ...); gymnasium: an
    # environment id (FrozenLake-v1, Taxi-v4, Blackjack-v1, ...). An unknown one lists the installed.
    id: str = ""
    # Keyword arguments: reasoning_gym: the dataset's config (min_terms, max_digits, ...; its size
    # and seed are the splits' below); gymnasium: gym.make's (is_slippery, map_name, ...).
    args: dict = field(default_factory=dict)
    # Tasks per split (val: validated on during training; test: held out, `eval.split: test`).
    train_size: int = bounded(64, Interval(ge=1, lt=SPLIT_SEED_STRIDE))
    val_size: int = bounded(16, Interval(ge=0, lt=SPLIT_SEED_STRIDE))
    test_size: int = bounded(16, Interval(ge=0, lt=SPLIT_SEED_STRIDE))
    # The splits' seeds: train from seed, val from seed + SPLIT_SEED_STRIDE, test from
    # seed + 2 * SPLIT_SEED_STRIDE (a dataset item's or reset's seed: disjoint between splits).
    seed: int = bounded(0, Ge(0))
    # gymnasium, openenv: environment steps (one model call each) per episode at most; then it is
    # cut. verifiers: model turns per episode at most.
    max_turns: int = bounded(20, Ge(1))
    reasoning_gym: ReasoningGymEnvConfig = field(default_factory=ReasoningGymEnvConfig)
    gymnasium: GymnasiumEnvConfig = field(default_factory=GymnasiumEnvConfig)
    verifiers: VerifiersEnvConfig = field(default_factory=VerifiersEnvConfig)
    openenv: OpenEnvEnvConfig = field(default_factory=OpenEnvEnvConfig)


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
