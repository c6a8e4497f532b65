"""The sections around the tasks: where they come from (`task_reader`), how an episode is
scored when the workflow returns no reward (`judge`), and what an evaluation runs (`eval`).

Part of the one schema (`ajet.config.schema` re-exports them; defaults live here and nowhere else)."""

from __future__ import annotations

from dataclasses import dataclass, field

from annotated_types import Ge, Gt, Interval

from ajet.config.choices import EvalSplit, OnError, ReaderType
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
