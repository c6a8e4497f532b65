"""`build_reader`: the configured task source → a `TaskReader`."""

from __future__ import annotations

import logging

from ajet.config.schema import EnvConfig, OnError, ReaderType, TaskReaderConfig
from ajet.envs import make_env_tasks
from ajet.task_reader.base import TaskReader, TaskReaderError, holdout_split
from ajet.task_reader.curriculum import Curriculum
from ajet.task_reader.env_reader import load_env_tasks
from ajet.task_reader.generate import LLM, aload_generated_tasks, run_sync
from ajet.task_reader.hf_dataset import load_hf_tasks
from ajet.task_reader.jsonl import read_jsonl_tasks
from ajet.task_reader.selection import TaskSelection
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)


def build_reader(cfg: TaskReaderConfig, *, seed: int, llm: LLM | None = None,
                 env: EnvConfig | None = None) -> TaskReader:
    """Read the tasks `cfg` names. `llm` (async prompt -> text) is needed only by `generate`,
    `env` (the config's `env` section) only by `env`.

    Callable from a running event loop too; a `generate` reader whose llm is bound to that
    loop should use `abuild_reader` instead.
    """
    return run_sync(abuild_reader(cfg, seed=seed, llm=llm, env=env))


async def abuild_reader(cfg: TaskReaderConfig, *, seed: int, llm: LLM | None = None,
                        env: EnvConfig | None = None) -> TaskReader:
    """`build_reader` for async callers: the `generate` reader awaits `llm` in this loop."""
    reader_type = ReaderType(cfg.type)
    skipped = 0
    val: list[WorkflowTask] = []
    test: list[WorkflowTask] = []
    if reader_type == ReaderType.jsonl:
        if not cfg.jsonl.train_path:
            raise TaskReaderError("task_reader.jsonl.train_path is empty; point it at a JSONL file")
        on_error = OnError(cfg.jsonl.on_error)
        train, skipped = read_jsonl_tasks(cfg.jsonl.train_path, on_error)
        if cfg.jsonl.val_path:
            val, val_skipped = read_jsonl_tasks(cfg.jsonl.val_path, on_error)
            skipped += val_skipped
        if cfg.jsonl.test_path:
            test, test_skipped = read_jsonl_tasks(cfg.jsonl.test_path, on_error)
            skipped += test_skipped
        source = cfg.jsonl.train_path
    elif reader_type == ReaderType.hf_dataset:
        train, val, skipped = load_hf_tasks(cfg.hf_dataset)
        source = cfg.hf_dataset.path
    elif reader_type == ReaderType.env_service:
        train, val, test = load_env_tasks(cfg.env_service)
        source = f"{cfg.env_service.base_url} ({cfg.env_service.env_type})"
    elif reader_type == ReaderType.env:
        if env is None:
            raise TaskReaderError("task_reader.type=env: pass the config's env section (build_reader(..., env=cfg.env))")
        train, val, test = make_env_tasks(env)
        source = f"env {env.type.value}:{env.id}"
    elif reader_type == ReaderType.generate:
        train, skipped = await aload_generated_tasks(cfg.generate, llm)
        source = cfg.generate.cache_path or ", ".join(cfg.generate.documents)
    else:  # pragma: no cover - ReaderType is closed
        raise TaskReaderError(f"unknown task_reader.type '{cfg.type}'")

    if val and cfg.val_fraction > 0:
        logger.warning(
            "task_reader.val_fraction=%s ignored: an explicit val set (%d tasks) is given",
            cfg.val_fraction, len(val),
        )
    elif cfg.val_fraction > 0:
        train, val = holdout_split(train, cfg.val_fraction, seed)
    curriculum = None
    if cfg.curriculum.key:
        c = cfg.curriculum
        curriculum = Curriculum(train, key=c.key, start=c.start, ramp_steps=c.ramp_steps, seed=seed)
    selection = TaskSelection(cfg.selection) if cfg.selection.enabled else None
    reader = TaskReader(train, val, seed=seed, shuffle=cfg.shuffle, skipped=skipped, source=source,
                        curriculum=curriculum, test=test, selection=selection)
    logger.info("%r", reader)
    return reader
