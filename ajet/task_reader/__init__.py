"""Task readers: where the tasks come from (JSONL, a local HF dataset, an env service, an
environment of the ecosystem (`ajet.envs`), or an LLM writing them from documents).
`build_reader(cfg.task_reader, seed=..., env=cfg.env)` is the entry point.
"""

from ajet.task_reader.base import TaskReader, TaskReaderError, holdout_split, split_tasks
from ajet.task_reader.build import abuild_reader, build_reader
from ajet.task_reader.env_client import AsyncEnvServiceClient, EnvServiceClient, EnvServiceError

__all__ = [
    "AsyncEnvServiceClient",
    "EnvServiceClient",
    "EnvServiceError",
    "TaskReader",
    "TaskReaderError",
    "abuild_reader",
    "build_reader",
    "holdout_split",
    "split_tasks",
]
