"""`ajet.files`: a file is its old content or its new content, never half of one, and no temp
file is left behind, whatever fails mid-write."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ajet.eval.metrics import write_report
from ajet.files import atomic_open, write_json_atomic, write_text_atomic
from ajet.outputs.report import write_report as write_training_report


def test_writes_replace_the_content_and_leave_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    write_text_atomic(path, "old")
    write_json_atomic(path, {"b": 1, "a": [1, 2]}, indent=2)
    assert json.loads(path.read_text()) == {"b": 1, "a": [1, 2]}
    assert path.read_text().startswith('{\n  "b"')
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_failing_rename_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pipeline.json"
    path.write_text("old content")

    def crash(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_text_atomic(path, "new content")
    assert path.read_text() == "old content"
    assert os.listdir(tmp_path) == ["pipeline.json"]


def test_a_failure_halfway_through_writing_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"ok": True})
    with pytest.raises(TypeError):  # json.dump has written '{"a": 1, "b": ' when it fails
        write_json_atomic(path, {"a": 1, "b": object()})
    with pytest.raises(RuntimeError), atomic_open(path) as handle:
        handle.write("half of a li")
        raise RuntimeError("killed")
    assert json.loads(path.read_text()) == {"ok": True}
    assert os.listdir(tmp_path) == ["summary.json"]


def test_permissions_are_set_before_any_content_is_written(tmp_path: Path) -> None:
    secret = tmp_path / "serve.json"
    write_json_atomic(secret, {"client_token": "t"}, permissions=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    plain = tmp_path / "plain.txt"
    write_text_atomic(plain, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~umask  # as open(..., "w") would make it


def test_binary_writes(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    with atomic_open(path, "wb") as handle:
        handle.write(b"\x89PNG")
    assert path.read_bytes() == b"\x89PNG"


def test_eval_and_training_reports_are_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "eval" / "eval_x.json"
    report.parent.mkdir()
    report.write_text("the previous report")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "split": "train", "reward/mean": 0.5}) + "\n")
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.json").write_text("the previous summary")

    def crash(src: object, dst: object) -> None:
        raise OSError("killed")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        write_report(report, name="x", model="m", split="val", n=1, temperature=1.0, metrics={}, results=[])
    with pytest.raises(OSError, match="killed"):
        write_training_report([run], out_dir=out)
    assert report.read_text() == "the previous report"
    assert os.listdir(report.parent) == ["eval_x.json"]
    assert (out / "summary.json").read_text() == "the previous summary"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
