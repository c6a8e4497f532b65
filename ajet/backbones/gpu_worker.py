"""ajet's episodes inside a GPU backbone's worker process (Trinity's workflow runner, verl's
agent-loop worker): `EpisodeRuntime`, and the pure pieces both workers use (sampling params for
vLLM, where a sample's response starts, the episode's metrics)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ajet.config import load_config
from ajet.config.schema import AjetConfig
from ajet.context.samples import episode_samples
from ajet.engine.base import SamplingParams
from ajet.errors import UserError
from ajet.rollout.workflow_loader import load_workflow

if TYPE_CHECKING:
    from ajet.rollout.runner import TaskRunner

log = logging.getLogger(__name__)


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
        if self.rollout.runner is None:  # EngineRollout builds one whenever it gets a workflow
            raise RuntimeError("the rollout has no task runner")
        self.runner: TaskRunner = self.rollout.runner

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
