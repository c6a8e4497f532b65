"""Tasks from a local Hugging Face `datasets` source; nothing is ever downloaded.

`path` may be
- a directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`;
- a single `.parquet`, `.json`/`.jsonl`, `.arrow` or `.csv` file (it is the train split);
- a directory of such files named after the splits (`train.parquet`, `test-00000.parquet`...).
Each row becomes a task: `query_column` is the query, the whole row is `task.metadata`
(a `task_id`/`id` column, when present, is the task id).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ajet.config.schema import HfDatasetReaderConfig
from ajet.task_reader.base import TaskReaderError
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)

_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow", ".csv": "csv"}


def load_hf_tasks(cfg: HfDatasetReaderConfig) -> tuple[list[WorkflowTask], list[WorkflowTask], int]:
    """Return (train tasks, val tasks, skipped rows) from `cfg.path`."""
    if not cfg.path:
        raise TaskReaderError("task_reader.hf_dataset.path is empty; point it at a local dataset")
    path = Path(cfg.path)
    if not path.exists():
        raise TaskReaderError(
            f"task_reader.hf_dataset.path not found: {path} (only local files are read; "
            "save a dataset with `Dataset.save_to_disk(dir)` or export it to parquet/jsonl)"
        )
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # a local source must never reach the hub
    splits = [s for s in (cfg.train_split, cfg.val_split) if s]
    data = _load_splits(path, splits)
    skipped = 0
    out: list[list[WorkflowTask]] = []
    for split in (cfg.train_split, cfg.val_split):
        if not split:
            out.append([])
            continue
        tasks, n_skipped = _rows_to_tasks(data[split], cfg.query_column, f"{path.stem}-{split}")
        out.append(tasks)
        skipped += n_skipped
    return out[0], out[1], skipped


def _load_splits(path: Path, splits: list[str]) -> dict[str, Any]:
    import datasets  # type: ignore[import-untyped]  # datasets ships no type information (no py.typed)

    if path.is_dir() and _is_saved_dataset(path):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.Dataset):
            loaded = datasets.DatasetDict({splits[0]: loaded})
            if len(splits) > 1:
                raise TaskReaderError(
                    f"{path} holds a single saved Dataset, so it has no '{splits[1]}' split; save a "
                    "DatasetDict, or leave task_reader.hf_dataset.val_split empty"
                )
        return {split: _pick_split(loaded, split, path) for split in splits}
    data_files, builder = _data_files(path, splits)
    out = {}
    for split, files in data_files.items():  # one by one: splits may have different columns
        try:
            out[split] = datasets.load_dataset(builder, data_files={split: files}, split=split)
        except datasets.exceptions.DatasetGenerationError as exc:
            raise TaskReaderError(
                f"cannot read split '{split}' from {files} as {builder}: {exc.__cause__ or exc}"
            ) from exc
    return out


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _data_files(path: Path, splits: list[str]) -> tuple[dict[str, list[str]], str]:
    if path.is_file():
        builder = _builder_for(path)
        if len(splits) > 1:
            raise TaskReaderError(
                f"{path} is one file, i.e. only the '{splits[0]}' split; put the splits in a "
                f"directory ({splits[0]}.parquet, {splits[1]}.parquet) or leave val_split empty"
            )
        return {splits[0]: [str(path)]}, builder
    files = sorted(p for p in path.iterdir() if p.suffix in _BUILDERS)
    data_files: dict[str, list[str]] = {}
    for split in splits:
        matched = [str(p) for p in files if p.stem == split or p.stem.startswith(f"{split}-")]
        if not matched:
            raise TaskReaderError(
                f"no files for split '{split}' in {path} (found: {[p.name for p in files]}); "
                f"name them '{split}.parquet' or '{split}-00000.parquet' (or .jsonl/.arrow/.csv)"
            )
        data_files[split] = matched
    builders = {_builder_for(Path(f)) for fs in data_files.values() for f in fs}
    if len(builders) != 1:
        raise TaskReaderError(f"{path}: mixed file formats {sorted(builders)}; use one format")
    return data_files, builders.pop()


def _builder_for(path: Path) -> str:
    builder = _BUILDERS.get(path.suffix)
    if builder is None:
        raise TaskReaderError(
            f"{path}: unsupported file type '{path.suffix}'; use one of {sorted(_BUILDERS)} "
            "or a directory saved with save_to_disk"
        )
    return builder


def _pick_split(loaded: Any, split: str, path: Path) -> Any:
    if split not in loaded:
        raise TaskReaderError(
            f"{path} has no split '{split}' (it has {list(loaded.keys())}); set "
            "task_reader.hf_dataset.train_split / val_split to one of those"
        )
    return loaded[split]


def _rows_to_tasks(dataset: Any, query_column: str, id_prefix: str) -> tuple[list[WorkflowTask], int]:
    if query_column not in dataset.column_names:
        raise TaskReaderError(
            f"column '{query_column}' not in the dataset (columns: {dataset.column_names}); "
            "set task_reader.hf_dataset.query_column"
        )
    tasks: list[WorkflowTask] = []
    skipped = 0
    for i, row in enumerate(dataset):
        query = row[query_column]
        if not isinstance(query, str) or not query.strip():
            logger.warning("%s row %d: skipping, '%s' is empty or not text", id_prefix, i, query_column)
            skipped += 1
            continue
        raw_id = row.get("task_id", row.get("id"))
        task_id = str(raw_id) if raw_id is not None else f"{id_prefix}-{i}"
        tasks.append(WorkflowTask(task_id=task_id, main_query=query, metadata=dict(row)))
    return tasks, skipped
