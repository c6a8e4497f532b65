"""scripts/bench/tinker_api.py on the tiny model: both sides do the same work (equal losses,
the same tokens), each run is timed, and the report prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'ajet[tinker]'")


def test_the_api_and_in_process_sides_do_the_same_work(script: Any, tiny_model_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    bench = script("bench.tinker_api")
    args = bench.parse_args(["--model", str(tiny_model_dir), "--datums", "2", "--tokens", "8", "--rank", "4",
                             "--concurrency", "1,3", "--max-tokens", "6", "--repeats", "2"])
    result = bench.run(args)
    training = result["training"]
    assert len(training["runs"]["api_s"]) == len(training["runs"]["in_process_s"]) == 2
    assert all(s > 0 for s in training["runs"]["api_s"] + training["runs"]["in_process_s"])
    # the two adapters start equal and take the same steps: the same losses, and they move
    assert training["losses"]["api"] == pytest.approx(training["losses"]["in_process"], rel=1e-4)
    assert training["losses"]["api"][0] != training["losses"]["api"][-1]
    assert 0 < training["service_trainer_s"]["median"] <= training["api_s"]["median"]
    assert sorted(result["sampling"]) == [1, 3]
    for concurrency, sampling in result["sampling"].items():
        assert sampling["tokens"]["api"] == sampling["tokens"]["in_process"]  # greedy: the same tokens
        assert 0 < sampling["tokens"]["api"][0] <= 6 * concurrency
        assert sampling["api_tok_s"]["min"] <= sampling["api_tok_s"]["median"] <= sampling["api_tok_s"]["max"]
    bench.report(result, args)
    out = capsys.readouterr().out
    assert "<= 1.15x" in out and ">= 0.8x" in out and "load average" in out
