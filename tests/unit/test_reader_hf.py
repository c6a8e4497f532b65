"""HF-dataset reader: local parquet/json files, split directories and save_to_disk dirs."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from ajet.config.schema import HfDatasetReaderConfig, ReaderType, TaskReaderConfig
from ajet.task_reader import TaskReaderError, build_reader

ROWS = [{"question": f"What is {i}+1?", "answer": str(i + 1), "level": i % 2} for i in range(6)]


def reader_cfg(path: Path, **kw) -> TaskReaderConfig:
    return TaskReaderConfig(type=ReaderType.hf_dataset, shuffle=False,
                            hf_dataset=HfDatasetReaderConfig(path=str(path), **kw))


def test_parquet_file_rows_become_tasks(tmp_path: Path) -> None:
    path = tmp_path / "gsm.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    reader = build_reader(reader_cfg(path), seed=0)
    tasks = reader.train_tasks()
    assert [t.main_query for t in tasks] == [r["question"] for r in ROWS]
    assert tasks[2].metadata == ROWS[2]  # the whole row
    assert tasks[2].task_id == "gsm-train-2"
    assert reader.val_tasks() == []


def test_split_directory_with_val(tmp_path: Path) -> None:
    datasets.Dataset.from_list(ROWS[:4]).to_json(str(tmp_path / "train.jsonl"))
    datasets.Dataset.from_list(
        [{"id": "v-1", "question": "val q", "answer": "x"}]
    ).to_json(str(tmp_path / "test.jsonl"))
    reader = build_reader(reader_cfg(tmp_path, val_split="test"), seed=0)
    assert len(reader.train_tasks()) == 4
    [val] = reader.val_tasks()
    assert val.task_id == "v-1" and val.main_query == "val q" and val.metadata["answer"] == "x"


def test_save_to_disk_dataset_dict(tmp_path: Path) -> None:
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_list(ROWS),
        "validation": datasets.Dataset.from_list(ROWS[:2]),
    })
    dd.save_to_disk(str(tmp_path / "saved"))
    reader = build_reader(reader_cfg(tmp_path / "saved", val_split="validation"), seed=0)
    assert len(reader.train_tasks()) == 6 and len(reader.val_tasks()) == 2
    with pytest.raises(TaskReaderError, match=r"no split 'dev' \(it has \['train', 'validation'\]\)"):
        build_reader(reader_cfg(tmp_path / "saved", val_split="dev"), seed=0)


def test_missing_query_column_names_columns(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    with pytest.raises(TaskReaderError, match=r"column 'problem' not in the dataset.*'question'"):
        build_reader(reader_cfg(path, query_column="problem"), seed=0)


def test_missing_path_and_bad_suffix(tmp_path: Path) -> None:
    with pytest.raises(TaskReaderError, match="only local files"):
        build_reader(reader_cfg(tmp_path / "nope"), seed=0)
    bad = tmp_path / "data.xlsx"
    bad.write_text("x")
    with pytest.raises(TaskReaderError, match="unsupported file type '.xlsx'"):
        build_reader(reader_cfg(bad), seed=0)


def test_unreadable_file_is_a_reader_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "a"}\n{oops\n')
    with pytest.raises(TaskReaderError, match=r"cannot read split 'train'.*broken.jsonl.*as json"):
        build_reader(reader_cfg(path), seed=0)
