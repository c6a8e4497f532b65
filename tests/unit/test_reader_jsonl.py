"""JSONL reader: field mapping, malformed lines under both policies, empty files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ajet.config.schema import JsonlReaderConfig, OnError, TaskReaderConfig
from ajet.task_reader import TaskReaderError, build_reader
from ajet.task_reader.jsonl import read_jsonl_tasks, row_to_task


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_fields_map_onto_workflow_task(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "math.jsonl", [
        json.dumps({"question": "1+1?", "answer": "2"}),
        "",
        json.dumps({"task_id": 7, "prompt": "p", "env_type": "kv", "metadata": {"a": 1, "b": 0},
                    "b": 2, "init_messages": [{"role": "system", "content": "s"}]}),
        "   ",
        json.dumps({"main_query": "m", "query": "q"}),
    ])
    tasks, skipped = read_jsonl_tasks(path)
    assert skipped == 0
    assert [t.task_id for t in tasks] == ["math-1", "7", "math-5"]  # default id: <stem>-<line>
    assert tasks[0].main_query == "1+1?" and tasks[0].metadata == {"answer": "2"}
    assert tasks[1].main_query == "p" and tasks[1].env_type == "kv"
    assert tasks[1].metadata == {"a": 1, "b": 2}  # top-level field wins over metadata
    assert tasks[1].init_messages == [{"role": "system", "content": "s"}]
    # main_query has priority; the other query-like key is kept in metadata
    assert tasks[2].main_query == "m" and tasks[2].metadata == {"query": "q"}


def test_init_messages_alone_is_a_task() -> None:
    task = row_to_task({"init_messages": [{"role": "user", "content": "hi"}]}, "x-1")
    assert task.main_query == "" and task.init_messages[0]["content"] == "hi"


BAD_LINES = {
    2: "{not json",
    3: "[1, 2]",
    4: json.dumps({"answer": "no question"}),
    5: json.dumps({"question": "q", "init_messages": "not a list"}),
}


def _mixed_file(tmp_path: Path) -> Path:
    lines = [json.dumps({"question": "good 1"})]
    lines += [BAD_LINES[i] for i in sorted(BAD_LINES)]
    lines += [json.dumps({"question": "good 2"})]
    return write_lines(tmp_path / "mixed.jsonl", lines)


def test_fail_policy_names_file_line_and_fix(tmp_path: Path) -> None:
    path = _mixed_file(tmp_path)
    with pytest.raises(TaskReaderError) as info:
        read_jsonl_tasks(path, OnError.fail)
    message = str(info.value)
    assert f"{path}:2" in message
    assert "invalid JSON" in message
    assert "on_error=skip" in message


@pytest.mark.parametrize("line,expected", [
    (3, "expected a JSON object"),
    (4, "no query"),
    (5, "init_messages"),
])
def test_fail_policy_says_what_is_wrong(tmp_path: Path, line: int, expected: str) -> None:
    good = [json.dumps({"task_id": f"t{i}", "question": "ok"}) for i in range(line - 1)]
    path = write_lines(tmp_path / "one.jsonl", good + [BAD_LINES[line]])
    with pytest.raises(TaskReaderError, match=rf"one.jsonl:{line}: malformed task: .*{expected}"):
        read_jsonl_tasks(path, OnError.fail)


def test_skip_policy_warns_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _mixed_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ajet.task_reader.jsonl"):
        tasks, skipped = read_jsonl_tasks(path, OnError.skip)
    assert [t.main_query for t in tasks] == ["good 1", "good 2"]
    assert skipped == 4
    warned = "\n".join(r.getMessage() for r in caplog.records)
    for line in BAD_LINES:
        assert f"{path}:{line}" in warned


def test_reader_exposes_skipped_count(tmp_path: Path) -> None:
    cfg = TaskReaderConfig(jsonl=JsonlReaderConfig(train_path=str(_mixed_file(tmp_path)),
                                                   on_error=OnError.skip))
    reader = build_reader(cfg, seed=0)
    assert reader.skipped == 4
    assert len(reader.train_tasks()) == 2


def test_duplicate_task_id_is_malformed(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "dup.jsonl", [
        json.dumps({"task_id": "a", "question": "1"}),
        json.dumps({"task_id": "a", "question": "2"}),
    ])
    with pytest.raises(TaskReaderError, match=r"dup.jsonl:2: .*duplicate task_id 'a'"):
        read_jsonl_tasks(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_a_clear_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(TaskReaderError, match=r"empty.jsonl: no tasks.*one JSON object per line"):
        read_jsonl_tasks(path)


def test_all_lines_skipped_is_an_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "bad.jsonl", ["{", "3"])
    with pytest.raises(TaskReaderError, match=r"no tasks \(2 malformed lines skipped\)"):
        read_jsonl_tasks(path, OnError.skip)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TaskReaderError, match="task file not found"):
        read_jsonl_tasks(tmp_path / "nope.jsonl")


def test_explicit_val_file(tmp_path: Path) -> None:
    train = write_lines(tmp_path / "train.jsonl", [json.dumps({"question": f"t{i}"}) for i in range(5)])
    val = write_lines(tmp_path / "val.jsonl", [json.dumps({"question": "v"})])
    cfg = TaskReaderConfig(val_fraction=0.5,  # ignored: an explicit val set wins
                           jsonl=JsonlReaderConfig(train_path=str(train), val_path=str(val)))
    reader = build_reader(cfg, seed=1)
    assert len(reader.train_tasks()) == 5
    assert [t.main_query for t in reader.val_tasks()] == ["v"]


def test_val_fraction_holds_out_deterministically(tmp_path: Path) -> None:
    train = write_lines(tmp_path / "train.jsonl", [json.dumps({"question": f"t{i}"}) for i in range(10)])
    cfg = TaskReaderConfig(val_fraction=0.2, jsonl=JsonlReaderConfig(train_path=str(train)))
    a, b = build_reader(cfg, seed=3), build_reader(cfg, seed=3)
    assert len(a.val_tasks()) == 2 and len(a.train_tasks()) == 8
    assert a.val_tasks() == b.val_tasks()
    assert not {t.task_id for t in a.val_tasks()} & {t.task_id for t in a.train_tasks()}


def test_explicit_test_file(tmp_path: Path) -> None:
    """task_reader.jsonl.test_path: a third split, apart from train and val (reported on only)."""
    train = write_lines(tmp_path / "train.jsonl", [json.dumps({"question": f"t{i}"}) for i in range(3)])
    val = write_lines(tmp_path / "val.jsonl", [json.dumps({"question": "v"})])
    test = write_lines(tmp_path / "test.jsonl", [json.dumps({"question": "x1"}), "not json",
                                                  json.dumps({"question": "x2"})])
    cfg = TaskReaderConfig(jsonl=JsonlReaderConfig(train_path=str(train), val_path=str(val),
                                                   test_path=str(test), on_error=OnError.skip))
    reader = build_reader(cfg, seed=0)
    assert [t.main_query for t in reader.test_tasks()] == ["x1", "x2"]
    assert [t.main_query for t in reader.val_tasks()] == ["v"] and len(reader.train_tasks()) == 3
    assert reader.skipped == 1  # the test file's malformed line is counted like any other
    assert "test=2" in repr(reader)
    # without test_path there is no test split (nothing is carved out of train or val)
    plain = build_reader(TaskReaderConfig(jsonl=JsonlReaderConfig(train_path=str(train), val_path=str(val))), seed=0)
    assert plain.test_tasks() == [] and len(plain.train_tasks()) == 3
