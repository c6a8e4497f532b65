"""Shared pieces of the GPU backbones (trinity, verl).

- checks and refusals: `require_gpus`, `common_refusals` (settings neither backbone honours);
- pure helpers of the translations: `run_dir`, `flatten`, `dump_yaml`, `lora_target_regex`;
- `EpisodeRuntime`: ajet's rollout (EngineRollout) inside a backbone's worker process (Trinity's
  workflow runner, verl's agent-loop worker), used by both adapters.

No torch / ray / trinity / verl import at module level.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ajet.algorithms.registry import backbone_algorithms, get_algorithm
from ajet.config import load_config
from ajet.config.schema import AjetConfig, ReaderType, TrinityConfig, VerlConfig
from ajet.context.samples import episode_samples
from ajet.engine.base import SamplingParams
from ajet.errors import SetupError, UserError
from ajet.gpus import visible_gpus
from ajet.models.resolve import ModelNotFoundError, resolve_model_path
from ajet.rollout.workflow_loader import as_workflow, load_workflow, target_of
from ajet.training.run_dir import run_dir_of

log = logging.getLogger(__name__)

def require_gpus(backbone: str, extra: str, module: str) -> None:
    """Fail with a clear message when the backbone cannot run on this machine."""
    import importlib.util

    if not visible_gpus():
        raise SetupError(
            f"--backbone={backbone} needs NVIDIA GPUs and none is visible on this machine.\n"
            f"  To train here (CPU or one GPU), use --backbone=debug.\n"
            f"  To inspect the translated {backbone} config, add --dry-run."
        )
    missing = [m for m in (module, "vllm") if importlib.util.find_spec(m) is None]
    if missing:
        raise SetupError(
            f"--backbone={backbone} needs the {' and '.join(repr(m) for m in missing)} package"
            f"{'s' if len(missing) > 1 else ''}: pip install 'ajet[{extra}-gpu]' "
            f"(in its own environment: make env-{extra} GPU=1)."
        )


def with_workflow(cfg: AjetConfig, workflow: Any) -> AjetConfig:
    """`cfg` whose `workflow.target` names `workflow` (from `ajet.tune`), so the backbone's
    workers can import it; unchanged when no workflow object was passed."""
    if workflow is None:
        return cfg
    import dataclasses

    target = target_of(as_workflow(workflow))
    return dataclasses.replace(cfg, workflow=dataclasses.replace(cfg.workflow, target=target))


def run_dir(cfg: AjetConfig) -> Path:
    """The run directory (absolute): every output of the run goes under it."""
    return run_dir_of(cfg).resolve()


def model_path_for(cfg: AjetConfig) -> tuple[str, bool]:
    """(local checkpoint path, found): the resolved model directory, or the configured
    string when it cannot be resolved on this machine (dry-run on a laptop)."""
    try:
        return str(resolve_model_path(cfg.model.path, cfg.model.cache_dir)), True
    except ModelNotFoundError as exc:
        log.debug("model.path not resolved here: %s", exc)
        return cfg.model.path, False


def changed_fields(section: Any, default: Any, prefix: str) -> list[str]:
    """Dotted keys of a dataclass section whose values differ from `default`'s (pure)."""
    out = []
    for name in vars(default):
        if getattr(section, name) != getattr(default, name):
            out.append(f"{prefix}.{name}")
    return out


def common_refusals(cfg: AjetConfig, backbone: str) -> list[tuple[str, str]]:
    """Settings neither GPU backbone can honour (pure): each names the key and the fix."""
    problems: list[tuple[str, str]] = []
    other, other_default = (
        ("verl", VerlConfig()) if backbone == "trinity" else ("trinity", TrinityConfig())
    )
    for key in changed_fields(getattr(cfg, other), other_default, other):
        problems.append((key, f"is a {other} setting and has no effect on --backbone={backbone}; "
                              f"remove it or use --backbone={other}"))
    if cfg.model.device == "cpu":
        problems.append(("model.device", f"=cpu cannot run on --backbone={backbone} (GPU only); "
                                         "use --backbone=debug to train on CPU"))
    spec = get_algorithm(cfg.algorithm.name)
    if backbone not in spec.backbone_names:
        problems.append(("algorithm.name", f"={spec.name} does not run on --backbone={backbone}: {spec.elsewhere} "
                                           f"(the {backbone} adapter trains {', '.join(backbone_algorithms(backbone))})"))
    if cfg.trainer.lr_schedule == "linear":
        problems.append(("trainer.lr_schedule", f"=linear is not offered by {backbone}'s FSDP "
                                                "optimizer; use constant or cosine"))
    if cfg.model.lora.enabled and cfg.model.lora.dropout:
        problems.append(("model.lora.dropout", f"has no {backbone} equivalent; set it to 0"))
    if cfg.rollout.max_staleness:
        problems.append(("rollout.max_staleness", f"(rollout overlapped with the update) is the debug backbone's; "
                                                  f"{backbone} schedules its own rollouts: set it to 0"))
    if cfg.model.lora.per_role:
        problems.append(("model.lora.per_role", f"(one LoRA adapter per role, served in mixed batches) "
                                                f"runs on the debug backbone's engine only; {backbone} "
                                                "trains one model: set it to false, or use --backbone=debug"))
    if cfg.task_reader.type == ReaderType.generate:
        problems.append(("task_reader.type", "=generate needs the local model to write tasks; "
                                             "generate them with --backbone=debug first, then "
                                             "point task_reader.jsonl at the result"))
    if cfg.task_reader.curriculum.key:
        problems.append(("task_reader.curriculum.key", f"is applied by the debug backbone's task "
                                                       f"reader; {backbone} reads the train tasks in "
                                                       "its own order: set it to '' (off)"))
    if cfg.judge.type == "group_rank":
        problems.append(("judge.type", f"=group_rank scores a group's episodes together, and {backbone} "
                                       "runs each episode on its own (its worker sees no group); use "
                                       "--backbone=debug, or a per-episode judge (e.g. judge.type=llm)"))
    return problems


def vllm_sampling(params: SamplingParams) -> dict[str, Any]:
    """ajet's sampling params as vLLM's (pure): what both backbones' engines send, the rest of
    each request being its server's own."""
    out: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_tokens,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if params.seed is not None:
        out["seed"] = params.seed
    return out


def lora_target_regex(modules: list[str]) -> str:
    """A module-name regex for a list of module names (trinity takes one string) (pure)."""
    if not modules:
        return "all-linear"
    if len(modules) == 1 and modules[0] == "all-linear":
        return "all-linear"
    return r".*\.(" + "|".join(sorted(set(modules))) + ")"


def dump_yaml(data: Any) -> str:
    """YAML text of plain data (dicts keep their insertion order)."""
    import yaml

    class NoAliases(yaml.SafeDumper):  # repeated sub-dicts are written out, not as &anchors
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump(data, Dumper=NoAliases, sort_keys=False, default_flow_style=False, allow_unicode=True)


def first_trained(sample: Any) -> int:
    """Where a sample's response starts for the GPU backbones: the index of its first trained
    token, or -1 without one (pure). Raises ValueError when its per-token lists differ in length."""
    n = len(sample.input_ids)
    if len(sample.loss_mask) != n or len(sample.old_logprobs) != n:
        raise ValueError(
            f"sample of episode {sample.episode_id!r}: input_ids ({n}), loss_mask "
            f"({len(sample.loss_mask)}) and old_logprobs ({len(sample.old_logprobs)}) differ in length"
        )
    for i, m in enumerate(sample.loss_mask):
        if m:
            return i
    return -1


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and empty dicts stay leaves (pure)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


# ---------------------------------------------------------------------- episodes in a worker
def refuse_role_rewards(episode: Any) -> None:
    """Per-role rewards cannot reach a GPU backbone's trainer (pure): Trinity and verl group
    experiences by task and train one reward per episode, so a role's samples would be compared
    with other roles' rewards. Raised rather than averaged into one reward, which would train
    every role on the mean, a silent change of the objective."""
    if episode.role_rewards:
        raise UserError(
            f"episode {episode.episode_id} (task {episode.task.task_id!r}) returned per-role rewards "
            f"{episode.role_rewards}: the trinity and verl backbones train one reward per episode (GRPO "
            "groups per task), not groups per task and role. Train per-role rewards with --backbone=debug, "
            "or return one reward, e.g. the reward of the role you train (workflow.trainable_targets)")


def episode_metrics(episode: Any) -> dict[str, float]:
    """Scalars of one episode for the backbone's own logger (pure)."""
    out = {"ajet/reward": float(episode.reward), "ajet/success": float(bool(episode.is_success)),
           "ajet/calls": float(episode.num_calls), "ajet/ok": float(episode.status == "ok"),
           "ajet/retries": float(episode.retries)}
    if episode.output is not None:
        out.update({f"ajet/workflow/{k}": float(v) for k, v in episode.output.log_metrics.items()})
    return out


class EpisodeRuntime:
    """ajet's rollout (`EngineRollout`) inside a foreign worker process (a Trinity workflow runner,
    a verl agent-loop worker): the user's workflow and judge, our tracker/session/tuner per
    episode, and a gateway for OpenAI-protocol agents, all against `engine` (the backbone's
    vLLM server behind ajet's InferenceEngine protocol; LLM judges on the policy model go
    through the gateway as in-run services). One per process and config.

    Default models served by ajet (`register_model(role, default_model="initial" | a path)`)
    exist on the debug backbone's engine only: the vLLM engine's `supports_models` is False, so
    registering one fails the episode with an error that names the role and the fix
    (`EpisodeSession.use_default_model`)."""

    _instances: dict[str, EpisodeRuntime] = {}

    def __init__(self, cfg: AjetConfig, engine: Any, tokenizer: Any) -> None:
        # imports agentscope and ray (ajet.tuner): gpu.py is on the path of ajet --dry-run
        from ajet.rollout.engine_rollout import EngineRollout

        self.cfg = cfg
        self.engine = engine
        # The translations size the backbone's engine window the same way.
        self.model_max_len = cfg.context.max_model_len or cfg.context.max_sample_tokens
        self.rollout = EngineRollout(cfg, engine, tokenizer, load_workflow(cfg.workflow.target),
                                   model_max_len=self.model_max_len)
        self.runner = self.rollout.runner

    @classmethod
    def shared(cls, config_path: str, engine_factory: Any, tokenizer: Any) -> EpisodeRuntime:
        """The process-wide runtime for `config_path`, built on first use with
        `engine_factory(tokenizer)`; `tokenizer` is a tokenizer or a path to load one from."""
        if config_path not in cls._instances:
            cfg = load_config(config_path)
            if isinstance(tokenizer, str):
                from transformers import AutoTokenizer  # heavy: gpu.py is on the path of --dry-run

                tokenizer = AutoTokenizer.from_pretrained(tokenizer)
            cls._instances[config_path] = cls(cfg, engine_factory(tokenizer), tokenizer)
        return cls._instances[config_path]

    async def run(self, task: Any, episode_id: str, group_id: str) -> tuple[Any, list[Any], dict[str, float]]:
        """Run one episode: (episode, its samples, metrics). A failed episode has no samples."""
        episode = await self.runner.run_episode(task, episode_id, group_id=group_id)
        refuse_role_rewards(episode)
        metrics = episode_metrics(episode)
        if episode.status != "ok":
            log.warning("episode %s (task %s) %s: %s", episode_id, task.task_id, episode.status, episode.reason)
            return episode, [], metrics
        samples, overflow = episode_samples(episode, self.cfg.context, self.model_max_len)
        metrics.update({f"ajet/context/{k}": float(v) for k, v in overflow.items()})
        metrics["ajet/samples"] = float(len(samples))
        return episode, samples, metrics

    def close(self) -> None:
        self.rollout.close()
