"""Tasks listed by an environment service.

Each task is `WorkflowTask(task_id=<service task id>, env_type=..., metadata={"env_base_url":
..., "split": ...})`; the workflow creates the environment instance itself
(`AsyncEnvServiceClient(task.metadata["env_base_url"]).create(task.env_type, task.task_id)`)
and reads the first observation from it, so `main_query` stays empty.
"""

from __future__ import annotations

import logging

from ajet.config.schema import EnvServiceReaderConfig
from ajet.task_reader.base import TaskReaderError
from ajet.task_reader.env_client import EnvServiceClient, EnvServiceError
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)


def load_env_tasks(
    cfg: EnvServiceReaderConfig,
) -> tuple[list[WorkflowTask], list[WorkflowTask], list[WorkflowTask]]:
    """(train, val, test) tasks: the first `num_train_tasks` of split 'train' (<= 0: all), the
    first `num_val_tasks` of split 'val' and the first `num_test_tasks` of split 'test' (0: none)."""
    with EnvServiceClient(cfg.base_url, timeout=cfg.request_timeout_s, retry_s=cfg.retry_s) as client:
        try:
            offered = client.health().get("env_types", [])
        except EnvServiceError as exc:
            if exc.status_code != 404:
                raise
            offered = []  # a service without /health: list_tasks below still checks it
        if not cfg.env_type:
            raise TaskReaderError(
                f"task_reader.env_service.env_type is empty; the service at {cfg.base_url} "
                f"offers {offered}"
            )
        if offered and cfg.env_type not in offered:
            raise TaskReaderError(
                f"the env service at {cfg.base_url} has no env_type '{cfg.env_type}'; it offers {offered}"
            )
        train_ids = client.list_tasks(cfg.env_type, "train")
        val_ids = client.list_tasks(cfg.env_type, "val") if cfg.num_val_tasks > 0 else []
        test_ids = client.list_tasks(cfg.env_type, "test") if cfg.num_test_tasks > 0 else []
    if cfg.num_train_tasks > 0:
        if len(train_ids) < cfg.num_train_tasks:
            logger.warning(
                "env service offers %d train tasks, fewer than num_train_tasks=%d; using all",
                len(train_ids), cfg.num_train_tasks,
            )
        train_ids = train_ids[: cfg.num_train_tasks]
    for split, ids, wanted in (("val", val_ids, cfg.num_val_tasks), ("test", test_ids, cfg.num_test_tasks)):
        if len(ids) < wanted:
            logger.warning("env service offers %d %s tasks, fewer than num_%s_tasks=%d; using all",
                           len(ids), split, split, wanted)
    val_ids, test_ids = val_ids[: cfg.num_val_tasks], test_ids[: cfg.num_test_tasks]

    def to_task(task_id: str, split: str) -> WorkflowTask:
        return WorkflowTask(
            task_id=str(task_id),
            env_type=cfg.env_type,
            metadata={"env_base_url": cfg.base_url, "split": split},
        )

    return ([to_task(t, "train") for t in train_ids], [to_task(t, "val") for t in val_ids],
            [to_task(t, "test") for t in test_ids])
