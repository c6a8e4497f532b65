"""The string choices of the config: enums and the constant lists derived from them (one
definition each; `ajet.config.schema` re-exports them)."""

from __future__ import annotations

from enum import Enum

# The algorithms' own choices are declared in their files (algorithm.name and pipeline.stages
# are read from `ajet.algorithms.registry`).
from ajet.algorithms.options import DpoLoss, ReferenceModel  # noqa: F401 - re-exported: the config's choices


class Backbone(str, Enum):
    debug = "debug"
    trinity = "trinity"
    verl = "verl"
    tinker = "tinker"


class StepCredit(str, Enum):
    """Credit for single steps on top of the episode's advantage (docs/credit.md)."""

    none = "none"
    # GiGPO (arXiv 2505.10978): steps of a task's rollouts that act in the same marked state
    # (WorkflowOutput.step_states) are compared by their discounted returns.
    gigpo = "gigpo"


class ToolCallGrammar(str, Enum):
    """Which tool calls decode under their tool's JSON schema (ajet/engine/grammar.py)."""

    off = "off"
    forced = "forced"  # calls that tool_choice forces
    all = "all"  # also calls the model starts itself (from its `<tool_call>` on)


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    auto = "auto"


class EngineDType(str, Enum):
    """The local engine's weights (ajet/engine/weights.py)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    bfloat16_linear = "bfloat16_linear"
    auto = "auto"


class OptimizerStateDType(str, Enum):
    """How AdamW stores its two moments (ajet/training/optim.py)."""

    float32 = "float32"
    bfloat16 = "bfloat16"  # half the memory; stochastic rounding (ajet/training/adamw.py)


class LrSchedule(str, Enum):
    constant = "constant"
    linear = "linear"
    cosine = "cosine"


class EvalSplit(str, Enum):
    val = "val"
    train = "train"
    test = "test"  # reported on, never used to choose settings (task_reader.jsonl.test_path)


# judge.type: one of these, or "package.module:ClassName" / "file.py:ClassName".
BUILTIN_JUDGES = ("none", "math", "exact_match", "countdown", "llm", "composite", "group_rank")


class LossAgg(str, Enum):
    token_mean = "token_mean"  # every trained token of the batch weighs the same
    seq_mean = "seq_mean"  # every LLM call (completion) weighs the same
    episode_mean = "episode_mean"  # every episode weighs the same


class OverflowPolicy(str, Enum):
    drop = "drop"  # drop the sample, count it
    truncate = "truncate"  # cut the sample, mask the cut tokens out of the loss, count it
    # Split the sample into window-sized pieces, count it. The member shadows str.split, which no
    # code calls on it; its name is the YAML's value.
    split = "split"  # type: ignore[assignment]


class ReaderType(str, Enum):
    jsonl = "jsonl"
    hf_dataset = "hf_dataset"
    env_service = "env_service"
    generate = "generate"
    env = "env"  # the tasks of the `env` section's environment (set when env.type is)


class EnvType(str, Enum):
    """An environment from the ecosystem that gives the tasks, the workflow and the reward
    (`env.type`; its adapter is `ajet.envs.<type>`, docs/environments.md)."""

    none = "none"  # no environment: task_reader gives the tasks, workflow.target the workflow
    reasoning_gym = "reasoning_gym"  # a reasoning-gym dataset, scored by its score_answer
    gymnasium = "gymnasium"  # a Gymnasium environment with a discrete action space, as text
    verifiers = "verifiers"  # a verifiers taskset, in its own environment behind a server, scored by its rewards
    openenv = "openenv"  # an OpenEnv server (started from its package or joined by URL), one session an episode


class PassOver(str, Enum):
    """Which settled train tasks `task_reader.selection` passes over (ajet/task_reader/selection.py)."""

    both = "both"  # the ones lately always solved and the ones never solved
    solved = "solved"  # only the always solved: a never-solved task is drawn, it may be in reach now
    failed = "failed"  # only the never solved


class OnError(str, Enum):
    skip = "skip"
    fail = "fail"


class SandboxBackend(str, Enum):
    """Where model-written code runs (ajet/sandbox, docs/sandbox.md)."""

    bwrap = "bwrap"  # bubblewrap on this machine
    service = "service"  # the sandbox service at sandbox.service_url (other machines)
    ray = "ray"  # sandbox.ray_hosts Ray actors on the cluster's nodes (--with-ray)


class ClientReward(str, Enum):
    """Whether `ajet serve` trains on a reward a client sends with `finish` (docs/episode_api.md)."""

    # Refused when a judge is configured (the judge scores every episode), accepted without one.
    auto = "auto"
    accept = "accept"  # the client's reward is the episode's reward, judge or not
    refuse = "refuse"  # a finish with a reward is answered 400 client_reward_refused
