"""`ajet serve`: listed in the help, light to start, and user errors exit 2 before anything loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ajet.cli import serve as serve_cmd

runner = CliRunner()


def _conf(tmp_path: Path, body: str = "") -> Path:
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  path: nowhere\ntask_reader:\n  jsonl:\n    train_path: train.jsonl\n" + body)
    return path


def test_serve_is_a_command_and_its_help_imports_nothing_heavy() -> None:
    code = ("import sys, json\nfrom ajet.cli.main import main\n"
            "try:\n    main(['serve', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print(json.dumps([m for m in ('torch', 'transformers', 'agentscope') if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "--conf" in out.stdout and "episode API" in out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    top = subprocess.run([sys.executable, "-m", "ajet.cli.main", "--help"], capture_output=True, text=True)
    assert "ajet serve" in top.stdout


def test_validation_is_refused_with_what_to_do(tmp_path: Path) -> None:
    result = runner.invoke(serve_cmd.app, ["--conf", str(_conf(tmp_path)), "trainer.val_every=2"])
    assert result.exit_code == 2
    assert "trainer.val_every" in result.output and "ajet eval" in result.output


def test_non_rl_algorithms_and_bad_serve_keys_exit_2(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    sft = runner.invoke(serve_cmd.app, ["--conf", str(conf), "algorithm.name=dpo"])
    assert sft.exit_code == 2 and "RL" in sft.output
    stale = runner.invoke(serve_cmd.app, ["--conf", str(conf), "rollout.max_staleness=-1"])
    assert stale.exit_code == 2 and "rollout.max_staleness" in stale.output


def test_the_removed_serve_max_staleness_names_its_replacement(tmp_path: Path) -> None:
    result = runner.invoke(serve_cmd.app, ["--conf", str(_conf(tmp_path)), "serve.max_staleness=1"])
    assert result.exit_code == 2
    assert "'serve.max_staleness' was removed" in result.output and "rollout.max_staleness" in result.output


def test_staleness_under_serve_needs_tis_but_not_an_engine_copy(tmp_path: Path) -> None:
    """One rule, `rollout.max_staleness`: off-policy episodes need the TIS correction; clients'
    calls wait out an update, so float32 weights (no engine copy) are fine under `ajet serve`."""
    conf = str(_conf(tmp_path))
    no_tis = runner.invoke(serve_cmd.app, ["--conf", conf, "rollout.max_staleness=1", "algorithm.tis_cap=0"])
    assert no_tis.exit_code == 2 and "algorithm.tis_cap" in no_tis.output
    ok = runner.invoke(serve_cmd.app, ["--conf", conf, "rollout.max_staleness=1", "algorithm.tis_cap=2",
                                       "rollout.engine_dtype=float32", "--dry-run"])
    assert ok.exit_code == 0, ok.output


def test_dry_run_says_which_task_metadata_keys_clients_see_and_which_stay_private(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"task_id": "a", "question": "1 + 1?", "answer": "2",
                                                      "expression": "1 + 1", "topic": "sums"}) + "\n")
    result = runner.invoke(serve_cmd.app, ["--conf", str(conf), "--dry-run", "--exp-dir", str(tmp_path / "exp"),
                                           "task_reader.type=jsonl",
                                           f"task_reader.jsonl.train_path={tmp_path / 'tasks.jsonl'}",
                                           "serve.public_metadata_keys=[topic]"])
    assert result.exit_code == 0, result.output
    assert "# clients see: task_id, main_query, init_messages, env_type, metadata ['topic']" in result.output
    assert "# stays on the server: metadata ['answer', 'expression']" in result.output
    assert not (tmp_path / "exp").exists()  # a dry run writes nothing


def test_client_reward_refuse_without_a_judge_exits_2(tmp_path: Path) -> None:
    """serve.client_reward (issue 69 §4): refuse with no judge would leave every episode without
    a reward; the default, auto, is in the resolved config."""
    conf = str(_conf(tmp_path))
    result = runner.invoke(serve_cmd.app, ["--conf", conf, "serve.client_reward=refuse", "--dry-run"])
    assert result.exit_code == 2 and "serve.client_reward=refuse with judge.type=none" in result.output
    shown = runner.invoke(serve_cmd.app, ["--conf", conf, "--dry-run", "--exp-dir", str(tmp_path / "exp")])
    assert shown.exit_code == 0 and "client_reward: auto" in shown.output, shown.output


def test_the_docs_config_loads_and_no_command_puts_a_token_on_the_command_line() -> None:
    """Before: docs/episode_api.md's config showed the removed serve.max_staleness, and the docs
    ran `ajet serve ... serve.client_token=secret`, where `ps` (and RUN/.lock) showed the token."""
    import re

    from ajet.config import load_config

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs/episode_api.md").read_text()
    block = doc.split("## Config", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = load_config(_write(block), require_workflow=False)
    assert cfg.serve.client_reward.value == "auto" and cfg.rollout.max_staleness == 0
    shown = [repo / "README.md", repo / "docs/episode_api.md", *sorted((repo / "tutorial").rglob("*.md")),
             *sorted((repo / "tutorial").rglob("*.yaml"))]
    for path in shown:
        literal = re.findall(r"serve\.client_token=(?!'?\$\{)\S+", path.read_text())
        assert not literal, f"{path}: {literal}"


def _write(text: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "c.yaml"
    path.write_text(text)
    return path

