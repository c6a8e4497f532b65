"""Checks that types alone cannot express: declared ranges, finite floats, and impossible
combinations across keys.

Each check returns (dotted key, message that says what would be valid). Single-key ranges
are declared in the schema (`bounded`) and checked by `range_problems`, not written here.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ajet.algorithms.base import Problems
from ajet.algorithms.registry import EVAL_STAGE, get_algorithm, names
from ajet.algorithms.registry import stage_names as known_stages
from ajet.config.ranges import range_problems
from ajet.config.schema import (
    BUILTIN_JUDGES,
    AjetConfig,
    EnvType,
    PipelineConfig,
    ReaderType,
    ReferenceModel,
    SandboxBackend,
    StepCredit,
)
from ajet.config.stages import (
    apply_override,
    name_problems,
    needs_workflow,
    stage_names,
    stage_overrides,
    stage_problems,
)
from ajet.errors import ConfigError


def validate(cfg: AjetConfig, *, require_workflow: bool = True) -> Problems:
    if unknown := name_problems(cfg):  # the other checks read the algorithms' specs
        return range_problems(cfg) + unknown
    require_workflow = require_workflow and needs_workflow(cfg)
    return (
        range_problems(cfg)
        + stage_problems(cfg)
        + run_problems(cfg)
        + workflow_problems(cfg, require_workflow=require_workflow)
        + judge_problems(cfg)
        + budget_problems(cfg)
        + staleness_problems(cfg, require_workflow=require_workflow)
        + algorithm_problems(cfg)
        + distill_problems(cfg)
        + lora_problems(cfg)
        + sandbox_problems(cfg)
        + task_reader_problems(cfg, require_workflow=require_workflow)
        + env_problems(cfg)
    )


def _need(ok: bool, key: str, msg: str) -> Problems:
    """[(key, msg)] unless `ok`."""
    return [] if ok else [(key, msg)]


def run_problems(cfg: AjetConfig) -> Problems:
    """The model, a deterministic run's settings, the run's names and what it saves."""
    problems = _need(bool(cfg.model.path), "model.path",
                     "empty; use 'smollm2-135m-instruct' or a local checkpoint dir")
    if cfg.trainer.deterministic:
        problems += _need(cfg.rollout.max_concurrency == 1, "rollout.max_concurrency",
                          f"={cfg.rollout.max_concurrency} with trainer.deterministic: episodes decoded in shared "
                          "batches give float results that depend on the batch (a resumed run differed by 5e-4); "
                          "set it to 1")
        problems += _need(cfg.rollout.max_staleness == 0, "rollout.max_staleness",
                          "> 0 with trainer.deterministic: the overlap makes what a step trains on depend on "
                          "timing; set it to 0")
    if (problem := project_name_problem(cfg.project.name)) is not None:
        problems.append(("project.name", problem))
    if cfg.eval.name and (problem := eval_name_problem(cfg.eval.name)) is not None:  # "" = from the model
        problems.append(("eval.name", problem))
    problems += _need(cfg.trainer.save_final_model or cfg.trainer.save_last_checkpoint, "trainer.save_last_checkpoint",
                      "false with trainer.save_final_model=false: the trained model would not be saved; "
                      "set either to true")
    marks = cfg.trainer.export_at_minutes
    problems += _need(all(m > 0 and math.isfinite(m) for m in marks), "trainer.export_at_minutes",
                      f"{marks}: give minutes > 0 (finite), e.g. [5, 10]")
    return problems


def workflow_problems(cfg: AjetConfig, *, require_workflow: bool) -> Problems:
    """`workflow.target`: given when a stage runs the workflow, well formed, its file there."""
    problems: Problems = []
    target = cfg.workflow.target
    if require_workflow:
        problems += _need(bool(target), "workflow.target",
                          "required: 'package.module:ClassName' or 'file.py:ClassName' (relative to the YAML)")
    if target:
        problems += _target_problems(target, "workflow.target", "ClassName")
    return problems


def _target_problems(target: str, key: str, name: str) -> Problems:
    """A `module:name` or `file.py:name` target: well formed, and its file there."""
    problems = _need(":" in target, key, f"'{target}' must be 'package.module:{name}' or 'file.py:{name}'")
    file_part = target.rpartition(":")[0]
    if file_part.endswith(".py"):
        problems += _need(Path(file_part).is_file(), key, f"file not found: {file_part}")
    return problems


def judge_problems(cfg: AjetConfig) -> Problems:
    """`judge.type` is a built-in judge or 'module:ClassName'; group_rank's own checks."""
    judge = cfg.judge.type
    problems = _need(judge in BUILTIN_JUDGES or ":" in judge, "judge.type",
                     f"'{judge}' is not one of {BUILTIN_JUDGES} nor 'module:ClassName'")
    if judge == "group_rank":
        problems += group_rank_problems(cfg)
    return problems


def budget_problems(cfg: AjetConfig) -> Problems:
    """A call's reply fits context.max_call_tokens, and a call fits a sample."""
    max_tokens, context = cfg.rollout.max_tokens, cfg.context
    return _need(
        max_tokens <= context.max_call_tokens,
        "rollout.max_tokens",
        f"{max_tokens} exceeds context.max_call_tokens={context.max_call_tokens}; "
        "raise context.max_call_tokens or lower rollout.max_tokens",
    ) + _need(
        context.max_call_tokens <= context.max_sample_tokens,
        "context.max_call_tokens",
        "must be <= context.max_sample_tokens",
    )


def staleness_problems(cfg: AjetConfig, *, require_workflow: bool) -> Problems:
    """rollout.max_staleness > 0: an engine with its own copy of the weights, and TIS."""
    r = cfg.rollout
    if r.max_staleness <= 0:  # 0 = on-policy (a negative value is a range problem)
        return []
    # In-process, the next step rolls out during the update: the engine needs its own copy of
    # the weights. Under `ajet serve` (no workflow) clients' calls wait out an update instead.
    return _need(
        r.engine_dtype != "float32" or not require_workflow,
        "rollout.max_staleness",
        f"={r.max_staleness} rolls out the next step while the trainer updates the weights, so the engine "
        "must decode with its own copy of them: set rollout.engine_dtype=float16 (x86 CPUs), bfloat16 (GPUs) or auto, "
        "or max_staleness=0",
    ) + _need(
        cfg.algorithm.tis_cap > 0,
        "algorithm.tis_cap",
        f"is 0, but rollout.max_staleness={r.max_staleness} trains on episodes sampled by older weights: "
        "set algorithm.tis_cap (e.g. 2) so the update corrects for it, or rollout.max_staleness=0",
    )


def algorithm_problems(cfg: AjetConfig) -> Problems:
    """What `algorithm.name` needs: groups of episodes, its step credit, a LoRA base as reference."""
    problems: Problems = []
    a = cfg.algorithm
    spec = get_algorithm(a.name)
    if spec.needs_groups:
        problems += _need(
            cfg.rollout.n >= 2,
            "rollout.n",
            f"{a.name} compares episodes of the same task, so rollout.n must be >= 2 "
            f"(e.g. rollout.n=4), or use an algorithm without groups ({', '.join(no_groups())})",
        )
    if a.step_credit != StepCredit.none:
        with_credit = [name for name in names() if a.step_credit.value in get_algorithm(name).step_credit]
        problems += _need(
            a.step_credit.value in spec.step_credit,
            "algorithm.step_credit",
            f"{a.step_credit.value} adds step credit to the episode advantage of {' or '.join(with_credit)}; it "
            f"needs algorithm.name={' or '.join(with_credit)} (not {a.name}), or set algorithm.step_credit=none",
        )
    if a.kl_coef > 0 and a.kl_reference == ReferenceModel.lora_base:
        problems += _need(
            cfg.model.lora.enabled,
            "algorithm.kl_reference",
            "'lora_base' needs model.lora.enabled=true; use 'frozen' for full fine-tuning",
        )
    return problems


def distill_problems(cfg: AjetConfig) -> Problems:
    """`distill.teacher` is read only when a trained stage distills."""
    trained_stages = set(stage_names(cfg)) - {EVAL_STAGE}
    if not (cfg.distill.teacher and trained_stages):  # an evaluation of a distill config is fine
        return []
    with_teacher = [name for name in names() if get_algorithm(name).teacher]
    return _need(
        any(get_algorithm(stage).teacher for stage in trained_stages),
        "distill.teacher",
        f"is read only by on-policy distillation; set algorithm.name={' or '.join(with_teacher)} (or add such "
        "a stage to pipeline.stages), or remove distill.teacher",
    )


def lora_problems(cfg: AjetConfig) -> Problems:
    """Per-role adapters: LoRA on, RL stages only; merged exports of per-role adapters only."""
    problems: Problems = []
    lora = cfg.model.lora
    if lora.per_role:
        problems += _need(
            lora.enabled,
            "model.lora.per_role",
            "gives each trainable role its own LoRA adapter, so it needs model.lora.enabled=true; "
            "set model.lora.enabled=true, or per_role=false to train one model for every role",
        )
        trained = set(stage_names(cfg)) - {EVAL_STAGE}
        problems += _need(
            not trained & {"sft", "dpo"},
            "model.lora.per_role",
            "trains one adapter per role in the RL recipes only; the sft and dpo stages would train "
            "just the active adapter. Run those stages without per_role (then start RL from their model)",
        )
    if lora.export_merged:
        problems += _need(
            lora.per_role,
            "model.lora.export_merged",
            "exports each role's adapter merged into the base (final_model/merged/<role>/), so it needs "
            "model.lora.per_role=true; without per-role adapters final_model/ is already the merged model",
        )
    return problems


def sandbox_problems(cfg: AjetConfig) -> Problems:
    """The sandbox service's URL when the sandbox runs as a service."""
    sandbox = cfg.sandbox
    if not (sandbox.enabled and sandbox.backend == SandboxBackend.service):
        return []
    return _need(bool(sandbox.service_url), "sandbox.service_url",
                 "required with sandbox.backend=service: the URL of `python -m ajet.sandbox.service`")


def task_reader_problems(cfg: AjetConfig, *, require_workflow: bool) -> Problems:
    """The chosen reader's files: given where required, and there (nothing is downloaded)."""
    problems: Problems = []
    tr = cfg.task_reader
    if tr.selection.enabled and tr.curriculum.key:
        problems += _need(False, "task_reader.selection.enabled", "true with task_reader.curriculum.key: the "
                          "curriculum draws from its own pool, the selection passes over tasks of the epoch walk; "
                          "use one of them")
    if tr.type == ReaderType.jsonl and require_workflow:
        problems += _need(bool(tr.jsonl.train_path), "task_reader.jsonl.train_path", "required for the jsonl reader")
    for key, value in (
        ("task_reader.jsonl.train_path", tr.jsonl.train_path),
        ("task_reader.jsonl.val_path", tr.jsonl.val_path),
        ("task_reader.jsonl.test_path", tr.jsonl.test_path),
    ):
        if tr.type == ReaderType.jsonl and value:
            problems += _need(Path(value).is_file(), key, f"file not found: {value}")
    if tr.type == ReaderType.hf_dataset:
        problems += _need(bool(tr.hf_dataset.path), "task_reader.hf_dataset.path", "required for hf_dataset")
        if tr.hf_dataset.path:
            problems += _need(Path(tr.hf_dataset.path).exists(), "task_reader.hf_dataset.path",
                              f"not found: {tr.hf_dataset.path} (only local files; nothing is downloaded)")
    if tr.type == ReaderType.generate:
        problems += _need(bool(tr.generate.documents), "task_reader.generate.documents",
                          "list at least one text file")
        for doc in tr.generate.documents:
            problems += _need(Path(doc).is_file(), "task_reader.generate.documents", f"file not found: {doc}")
    return problems


def env_problems(cfg: AjetConfig) -> Problems:
    """`env`: an id when a type is set, and one source of tasks (the env or task_reader)."""
    env, reader_type = cfg.env, cfg.task_reader.type
    if env.type == EnvType.none:
        return _need(reader_type != ReaderType.env, "task_reader.type",
                     "env needs env.type (reasoning_gym or gymnasium) and env.id; see docs/environments.md")
    problems = _need(bool(env.id), "env.id", f"required with env.type={env.type.value}: a "
                     + ("dataset name, e.g. basic_arithmetic" if env.type == EnvType.reasoning_gym
                        else "environment id, e.g. FrozenLake-v1"))
    problems += _need(reader_type == ReaderType.env, "task_reader.type",
                      f"{reader_type.value} with env.type={env.type.value}: the environment gives the tasks; "
                      "remove task_reader.type and its files from the YAML (or env, to read them)")
    for key, target in (("renderer", env.gymnasium.renderer), ("task_args", env.gymnasium.task_args)):
        if target:
            problems += _target_problems(target, f"env.gymnasium.{key}", "function")
    return problems


def no_groups() -> list[str]:
    """The RL algorithms that need no group of episodes per task."""
    return [name for name in names(recipe="rl") if not get_algorithm(name).needs_groups]


def group_rank_problems(cfg: AjetConfig) -> Problems:
    """judge.type=group_rank: a group to compare, its own settings, a reply that fits the engine."""
    problems: Problems = []
    g = cfg.judge.group_rank
    if cfg.rollout.n < 2:
        problems.append(("rollout.n", f"is {cfg.rollout.n}, but judge.type=group_rank scores the rollout.n "
                                      "episodes of a task against each other; set rollout.n >= 2 (e.g. 4)"))
    if cfg.judge.params:
        problems.append(("judge.params", f"{sorted(cfg.judge.params)} is not read by judge.type=group_rank; "
                                         "set judge.group_rank.<key> instead"))
    if g.base_url and not g.model:
        problems.append(("judge.group_rank.model", f"required with judge.group_rank.base_url={g.base_url}"))
    if not g.base_url and g.max_tokens > cfg.context.max_call_tokens:
        problems.append(("judge.group_rank.max_tokens", f"{g.max_tokens} exceeds context.max_call_tokens="
                                                        f"{cfg.context.max_call_tokens} (the policy judges); "
                                                        "lower it or raise context.max_call_tokens"))
    return problems


def single_stage_config(cfg: AjetConfig, stage: str, *, where: str = "") -> AjetConfig:
    """`cfg` as one stage runs it: its `pipeline.overrides` merged in, its algorithm set, validated."""
    if stage not in known_stages():
        raise ConfigError(f"{where}unknown stage '{stage}'; use one of {known_stages()}")
    try:
        stage_cfg = apply_override(cfg, stage_overrides(cfg).get(stage, {}))
    except ValueError as exc:
        raise ConfigError(f"{where}pipeline.overrides.{stage}: {exc}") from None
    stage_cfg.pipeline = PipelineConfig(stages=[stage])
    if stage != EVAL_STAGE:
        stage_cfg.algorithm = dataclasses.replace(stage_cfg.algorithm, name=stage)
    if stage == EVAL_STAGE or get_algorithm(stage).recipe != "rl":  # step credit is the RL stages' (a warm-up before GRPO has none)
        stage_cfg.algorithm = dataclasses.replace(stage_cfg.algorithm, step_credit=StepCredit.none)
    problems = validate(stage_cfg)
    if problems:
        lines = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        raise ConfigError(f"{where}invalid config for the {stage} stage:\n{lines}")
    return stage_cfg


def project_name_problem(name: str) -> str | None:
    """Why `project.name` cannot name a run directory under `project.exp_dir`, or None."""
    return name_problem(name, key="project.name", under="project.exp_dir", example="math_agent")


def eval_name_problem(name: str) -> str | None:
    """Why `eval.name` (`ajet eval --name`) cannot name a report RUN/eval/eval_<name>.json, or None."""
    return name_problem(name, key="eval.name", under="RUN/eval", example="sft_step_40")


def name_problem(name: str, *, key: str, under: str, example: str) -> str | None:
    """Why `name` (the setting `key`) cannot name a path under `under`, or None. A name is
    relative, with no empty, `.` or `..` part: `/etc/x` would write outside `under`, `../../x`
    would climb out of it, and `.` would make `under` itself the path (for a run directory:
    the experiments root, which `--fresh` renames aside whole)."""
    parts = name.replace("\\", "/").split("/")
    if not name.strip():
        return f"is empty; give a name, e.g. {key}={example}"
    if name.startswith(("/", "~")) or (len(name) > 1 and name[1] == ":"):
        return f"'{name}' is an absolute path; it must be a name under {under}"
    if any(part in ("", ".", "..") for part in parts):
        return (f"'{name}' has an empty, '.' or '..' part; it must name a path under {under} "
                "(letters, digits, '-', '_', and '/' between parts)")
    if any(ord(c) < 32 for c in name):
        return f"{name!r} has a control character"
    return None
