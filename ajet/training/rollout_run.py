"""What a recipe that trains on its own rollouts (RL, online DPO) sets up, once.

In order: the run directory; the user's workflow, tasks and judge (user code and data fail
before the model loads); the step loop; the model; the in-process rollout on it (engine,
gateway, runner, manager); the optimizer and schedule, handed to the loop for checkpoints.
`restore()` is separate: a recipe first builds what must see the initial weights (a reference
policy), then loads the checkpoint of a resumed run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ajet.config.schema import AjetConfig
from ajet.engine.local import LocalEngine
from ajet.errors import RunDataError
from ajet.judge import Judge, build_judge
from ajet.rollout.engine_rollout import EngineRollout
from ajet.rollout.workflow_loader import WorkflowArg, load_or_wrap_workflow, trainable_targets_of
from ajet.task_reader import TaskReader, build_reader
from ajet.training.loop import TrainingLoop
from ajet.training.model import load_trainable_model, model_window
from ajet.training.optim import build_optimizer
from ajet.training.recipe import Closers
from ajet.training.run_dir import prepare_run_dir
from ajet.workflow import Workflow

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LRScheduler
    from transformers import PreTrainedTokenizerBase


@dataclass
class RolloutRun:
    run_dir: Path
    workflow: Workflow
    reader: TaskReader
    judge: Judge | None  # None: `judge.type: none` (the workflow's reward)
    training_loop: TrainingLoop
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    window: int  # the model's context window for this run (tokens)
    rollout: EngineRollout[LocalEngine]
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler

    @classmethod
    def start(cls, cfg: AjetConfig, closers: Closers, *, resume: bool, workflow: WorkflowArg | None = None) -> RolloutRun:
        """Build everything in order; each thing that must be closed is pushed as it starts."""
        run_dir = prepare_run_dir(cfg, resume=resume)
        workflow = load_or_wrap_workflow(workflow, cfg.workflow.target)
        reader = build_reader(cfg.task_reader, seed=cfg.project.seed, env=cfg.env)
        rollout: list[EngineRollout[LocalEngine]] = []  # LLM judges call the policy through the rollout's gateway
        judge = build_judge(cfg.judge, llm_client_factory=lambda: rollout[0].llm_client())
        loop = TrainingLoop(cfg, run_dir, closers, total_steps=cfg.trainer.total_steps, resume=resume)
        model, tokenizer = load_trainable_model(
            cfg.model, seed=cfg.project.seed, gradient_checkpointing=cfg.trainer.gradient_checkpointing,
            keep_matmuls=cfg.trainer.checkpoint_keep_matmuls,
            trainable_targets=trainable_targets_of(cfg.workflow.trainable_targets, workflow))
        window = model_window(model, cfg.context.max_model_len)
        rollout.append(EngineRollout.local(cfg, model, tokenizer, workflow, model_max_len=window, judge=judge))
        closers.push(rollout[0].close, "rollout")
        optimizer, scheduler = build_optimizer(model, cfg.trainer, seed=cfg.project.seed)
        loop.attach(model, tokenizer, optimizer, scheduler, state=lambda step: {"reader": reader.state_at_end_of(step)})
        return cls(run_dir, workflow, reader, judge, loop, model, tokenizer, window, rollout[0], optimizer,
                   scheduler)

    def restore(self) -> None:
        """Continue a resumed run from its newest checkpoint: weights, optimizer, schedule, reader."""
        state = self.training_loop.restore()
        if state is not None:
            reader = state.get("reader")
            if not isinstance(reader, dict):  # what `start` saved: TaskReader.state_at_end_of's dict
                raise RunDataError(f"the checkpoint holds no task reader state ({type(reader).__name__} as 'reader'): "
                                   "it was not written by this recipe. Start a new run (--fresh).")
            self.reader.load_state_dict(reader, allow_changed=self.training_loop.cfg.project.resume_changed)
            self.rollout.engine.bump_version()
