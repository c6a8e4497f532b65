"""Run verl's PPO trainer on this run's config (GPU path; nothing heavy imported until started).

1. write the resolved ajet config to RUN/config.yaml (the agent loop reads it),
2. export the reader's tasks to RUN/verl/{train,val}.parquet (one row per task),
3. register our agent loop in RUN/verl/agent_loops.yaml,
4. run `python -m verl.trainer.main_ppo <overrides>` as a managed child: verl starts its
   own local Ray (or joins `ray.address` through RAY_ADDRESS); Ctrl-C stops the child's
   process group, nothing else.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ajet.backbones.gpu_config import dump_yaml, model_path_for, run_dir
from ajet.backbones.verl.convert import task_to_verl_row, write_parquet
from ajet.backbones.verl.translation import (
    agent_loop_registry,
    hydra_overrides,
    to_verl_config,
    verl_dir,
)
from ajet.config import AjetConfig
from ajet.errors import SetupError, UserError
from ajet.gpus import require_free_gpus
from ajet.launcher import Launcher
from ajet.ray_env import ray_env
from ajet.task_reader import build_reader
from ajet.training.run_dir import prepare_run_dir

log = logging.getLogger(__name__)


def prepare(cfg: AjetConfig, *, resume: bool) -> list[str]:
    """Write everything verl reads; return the Hydra overrides (no GPU needed)."""
    model_path, found = model_path_for(cfg)
    if not found:
        raise UserError(f"model.path={cfg.model.path} is not a local checkpoint on this machine")
    run = prepare_run_dir(cfg, resume=resume, backbone_checkpoints="verl/checkpoints/global_step_*").resolve()
    out, config_path = Path(verl_dir(cfg)), str(run / "config.yaml")
    reader = build_reader(cfg.task_reader, seed=cfg.project.seed, env=cfg.env)
    train, val = reader.train_tasks(), reader.val_tasks() or reader.train_tasks()[:8]
    for name, tasks in (("train", train), ("val", val)):
        rows = [task_to_verl_row(t, index=i, split=name, config_path=config_path) for i, t in enumerate(tasks)]
        write_parquet(out / f"{name}.parquet", rows)
    (out / "agent_loops.yaml").write_text(dump_yaml(agent_loop_registry()))
    overrides = to_verl_config(cfg, model_path=model_path, resume=resume)
    (out / "overrides.yaml").write_text(dump_yaml(overrides))
    log.info("verl: %d train / %d val tasks written under %s", len(train), len(val), out)
    return hydra_overrides(overrides)


def run_verl(cfg: AjetConfig, *, resume: bool) -> None:
    if cfg.verl.nnodes == 1:
        require_free_gpus(cfg.verl.n_gpus_per_node, "verl")
    argv = [sys.executable, "-m", "verl.trainer.main_ppo", *prepare(cfg, resume=resume)]
    # verl starts its own Ray unless it joins one: keep that one on ray.node_ip too.
    env = {"RAY_ADDRESS": cfg.ray.address} if cfg.ray.address else ray_env(cfg.ray.node_ip)
    with Launcher(log_dir=run_dir(cfg) / "services") as launcher:
        log.info("verl: running %s", " ".join(argv[:3]))
        code = launcher.run_command(argv, name="verl", env=env)
    if code != 0:
        raise SetupError(f"verl exited with code {code}; see its output above and {verl_dir(cfg)}")
    log.info("verl run finished; checkpoints under %s", Path(verl_dir(cfg)) / "checkpoints")
