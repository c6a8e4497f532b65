"""Run Trinity-RFT on this run's config (GPU path; imports nothing heavy until started).

1. write the resolved ajet config to RUN/config.yaml (the workflow plugin reads it),
2. export the reader's tasks to RUN/tasks/{train,validation}.jsonl,
3. write Trinity's config to RUN/trinity_config.yaml (Trinity's own outputs and
   checkpoints go to RUN/trinity/),
4. start (or join `ray.address`) a Ray head node and run `trinity run --config ...` as a
   managed child: Ctrl-C stops Trinity and the head node, nothing else.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

from ajet.backbones.gpu_config import dump_yaml, model_path_for, run_dir
from ajet.backbones.trinity.convert import write_taskset
from ajet.backbones.trinity.translation import to_trinity_config
from ajet.config import AjetConfig
from ajet.errors import SetupError, UserError
from ajet.gpus import require_free_gpus
from ajet.launcher import Launcher
from ajet.task_reader import build_reader
from ajet.training.run_dir import prepare_run_dir

log = logging.getLogger(__name__)


def prepare(cfg: AjetConfig, *, resume: bool) -> Path:
    """Write everything Trinity reads; return the path of its config (no GPU needed)."""
    model_path, found = model_path_for(cfg)
    if not found:
        raise UserError(f"model.path={cfg.model.path} is not a local checkpoint on this machine")
    run = prepare_run_dir(cfg, resume=resume, backbone_checkpoints="trinity/global_step_*").resolve()
    reader = build_reader(cfg.task_reader, seed=cfg.project.seed, env=cfg.env)
    train, val = reader.train_tasks(), reader.val_tasks()
    write_taskset(run / "tasks", train, val if cfg.trainer.val_every else [])
    log.info("trinity: %d train / %d val tasks written to %s", len(train), len(val), run / "tasks")
    path = run / "trinity_config.yaml"
    path.write_text(dump_yaml(to_trinity_config(cfg, model_path=model_path, resume=resume)))
    return path


def run_trinity(cfg: AjetConfig, *, resume: bool) -> None:
    t = cfg.trinity
    gpus = t.explorer_gpus + t.trainer_gpus
    require_free_gpus(gpus, "trinity")
    config_path = prepare(cfg, resume=resume)
    trinity_bin = shutil.which("trinity", path=str(Path(sys.executable).parent)) or shutil.which("trinity")
    if trinity_bin is None:
        raise SetupError("the `trinity` command is not installed: pip install 'ajet[trinity-gpu]' "
                        "(in its own environment: make env-trinity GPU=1)")
    run = run_dir(cfg)
    with Launcher(ray=None if cfg.ray.address else "head", ray_address=cfg.ray.address,
                  ray_num_gpus=gpus, ray_node_ip=cfg.ray.node_ip, log_dir=run / "services") as launcher:
        env = launcher.ray_child_env()
        log.info("trinity: running %s run --config %s", trinity_bin, config_path)
        code = launcher.run_command([trinity_bin, "run", "--config", str(config_path)], name="trinity", env=env)
    if code != 0:
        raise SetupError(f"trinity exited with code {code}; see its output above and {run / 'trinity'}")
    log.info("trinity run finished; checkpoints under %s", run / "trinity")
