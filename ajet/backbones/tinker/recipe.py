"""The RL recipe with its update on a Tinker service: `TinkerRecipe` is the RL recipe
(`ajet.rl.recipe.RLRecipe`: the same step loop, rollout, merging, advantages, records and
commit) whose setup builds no local model, and whose `update` is remote.

setup: run dir, workflow, tasks, judge, the step loop; the service's training client (restored
from the checkpoint's saved state on --resume) and its sampler behind ajet's engine protocol
(`TinkerEngine`), the gateway and rollout on it.

One step (`RLRecipe.train`): roll out on the sampler -> merged samples with per-token
advantages -> `update`: the samples as datums (advantage x loss weight, the sampler's logprobs),
`forward_backward` with the algorithm's built-in loss, `optim_step` at the schedule's learning
rate, then the new weights saved for sampling and a new sampler published -> commit.

A step is a transaction. A checkpoint is the service's saved state of the step (`save_state`: the
adapter and its optimizer, immutable once saved, named by the step) with ajet's own: the
reader's position, the schedule, RNG, counters and metrics, written atomically by the loop. What
is guaranteed: `--resume` continues from the newest checkpoint on disk, with a new training
client made from that step's saved state, so an update begun after it (sent to the service but
not committed: a stop between `forward_backward` and the commit) is never applied twice, and its
step is trained again from the same tasks. A stop while the service saves a state leaves at worst
an unreferenced saved state on the service; the local checkpoint that would name it is written
only after the service has answered.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, cast

from ajet.algorithms.registry import get_algorithm
from ajet.backbones.tinker.datums import logprob_mismatch, loss_config, remote_datums
from ajet.backbones.tinker.engine import TinkerEngine
from ajet.backbones.tinker.remote import RemoteTrainer
from ajet.errors import InfrastructureError, UserError
from ajet.files import write_json_atomic
from ajet.judge import build_judge
from ajet.rl.recipe import RLRecipe
from ajet.rl.samples import StepBatch
from ajet.rollout.engine_rollout import EngineRollout
from ajet.rollout.source import managed_episodes
from ajet.rollout.workflow_loader import load_or_wrap_workflow
from ajet.task_reader import build_reader
from ajet.training.loop import TrainingLoop
from ajet.training.optim import build_optimizer
from ajet.training.recipe import Closers
from ajet.training.run_dir import prepare_run_dir

log = logging.getLogger(__name__)


class TinkerRecipe(RLRecipe):
    # ------------------------------------------------------------------ setup
    def setup(self, closers: Closers) -> None:
        import torch  # the loop's schedule and checkpoint files

        cfg = self.cfg
        self.algorithm = get_algorithm(cfg.algorithm.name)
        self.loss_fn = self.algorithm.backbone_names["tinker"]  # the capabilities admit only those that name one
        self.loss_fn_config = loss_config(self.loss_fn, cfg.algorithm)
        self.run_dir = prepare_run_dir(cfg, resume=self.resume)
        self.workflow = load_or_wrap_workflow(self.workflow_arg, cfg.workflow.target)
        self.reader = build_reader(cfg.task_reader, seed=cfg.project.seed, env=cfg.env)
        rollouts: list[EngineRollout[TinkerEngine]] = []  # LLM judges call the policy through its gateway
        self.judge = build_judge(cfg.judge, llm_client_factory=lambda: rollouts[0].llm_client())
        self.training_loop = TrainingLoop(cfg, self.run_dir, closers, total_steps=cfg.trainer.total_steps,
                                          resume=self.resume)
        # The weights are the service's; the loop's LR schedule (warmup, decay: every recipe's) runs
        # on a one-number placeholder, and each step sends its learning rate with optim_step.
        placeholder = torch.nn.Module()
        placeholder.register_parameter("lr_schedule", torch.nn.Parameter(torch.zeros(1)))
        _, self.scheduler = build_optimizer(placeholder, cfg.trainer, seed=cfg.project.seed)
        self.remote = RemoteTrainer(cfg)
        closers.push(self.remote.close, "tinker session")
        self.training_loop.attach(cast(Any, placeholder), None, self.scheduler.optimizer, self.scheduler,
                                  state=lambda step: {"reader": self.reader.state_at_end_of(step)},
                                  export=self.export)
        saved: list[str] = []
        self.training_loop.keep("tinker", self._saved_state, lambda state: saved.append(str(state["state_path"])))
        if self.resume and (state := self.training_loop.restore()) is not None:
            reader_state = state["reader"]
            assert isinstance(reader_state, dict)  # what `state_at_end_of` returned, read back
            self.reader.load_state_dict(reader_state, allow_changed=cfg.project.resume_changed)
            if not saved:
                raise RuntimeError("--resume: the checkpoint names no Tinker state (was it written by another backbone?)")
        self.remote.start(resume_from=saved[0] if saved else None, loss_fn=self.loss_fn,
                          loss_fn_config=self.loss_fn_config)
        self.tokenizer = self.remote.tokenizer()
        self.window = cfg.context.max_model_len or cfg.context.max_sample_tokens
        version = self.training_loop.step
        engine = TinkerEngine(self.remote.sampler(f"step_{version:06d}"), policy_version=version)
        rollouts.append(EngineRollout(cfg, engine, self.tokenizer, self.workflow, model_max_len=self.window,
                                      judge=self.judge))
        self.engine = engine
        # The RL step reads of its rollout's engine what every engine has (policy_version,
        # decoded_tokens, take_metrics); the overlap and distillation that need a LocalEngine are refused here.
        self.rollout = cast(Any, rollouts[0])
        closers.push(self.rollout.close, "rollout")
        self.manager = self.rollout.manager
        self.teacher = None  # no distillation: the capabilities admit the GRPO family only
        self.source = managed_episodes(self.manager, self.reader, cfg.rollout, batch_size=cfg.trainer.batch_size,
                                       phase=self.training_loop.phase)
        closers.push(self.source.close, "episode source")
        log.info("tinker backbone: training %s (LoRA r=%d) at %s with loss_fn=%s", cfg.tinker.base_model,
                 cfg.model.lora.r, self.remote.where, self.loss_fn)

    def _saved_state(self) -> dict[str, str]:
        """The checkpoint's remote half: the service saves the training client's state (weights and
        optimizer) of the step being checkpointed. A RuntimeError when it cannot: the loop reports it
        (and a stop's checkpoint is then not written; the newest on disk stays the one to resume from)."""
        step = self.training_loop.step
        try:
            return {"state_path": self.remote.save_state(step)}
        except (UserError, InfrastructureError) as err:
            raise RuntimeError(f"the checkpoint of step {step} needs the Tinker service's saved state: {err}") from err

    # ------------------------------------------------------------------ the remote update
    def update(self, batch: StepBatch, *, step: int | None = None, overlap: bool = False) -> dict[str, float]:
        """The step's samples to the service: forward_backward + optim_step (per PPO epoch), then
        the new weights published to the sampler the next rollout uses."""
        datums = remote_datums(batch.samples, batch.weights)
        learning_rate = float(self.scheduler.get_last_lr()[0])  # the schedule's, for this step
        start = time.monotonic()
        # From here the service's weights may be the next step's: a stop neither saves them as
        # this step's checkpoint nor abandons the step (`TrainingLoop.update_begins`).
        self.training_loop.update_begins()
        metrics, trainer_logprobs = self.remote.train(datums, self.loss_fn, self.loss_fn_config,
                                                      learning_rate=learning_rate, epochs=self.cfg.trainer.ppo_epochs)
        metrics.update(logprob_mismatch(datums, trainer_logprobs))
        metrics["perf/update_s"] = time.monotonic() - start
        version = self.engine.policy_version + 1
        self.engine.publish(self.remote.sampler(f"step_{version:06d}"), version)
        metrics["perf/publish_s"] = time.monotonic() - start - metrics["perf/update_s"]
        metrics["context/datums"] = float(len(datums))
        metrics["context/datum_tokens"] = float(sum(len(d.model_input) for d in datums))
        return metrics

    def export(self, out: Path) -> None:
        """The final model is the service's: its weights saved for sampling, named in out/tinker.json."""
        out.mkdir(parents=True, exist_ok=True)
        path = self.remote.sampler_path(f"export-step_{self.training_loop.step:06d}")
        write_json_atomic(out / "tinker.json", {"base_model": self.cfg.tinker.base_model,
                                                "sampler_weights": path, "step": self.training_loop.step,
                                                "lora_rank": self.cfg.model.lora.r})
        log.info("final model: the service's sampler weights %s (%s)", path, out / "tinker.json")

