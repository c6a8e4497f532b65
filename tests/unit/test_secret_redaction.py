"""Secrets never reach a saved or uploaded config, the run directory's lock or its error (issue 69
§4): one rule, `ajet.config.redact`, behind `to_yaml` (RUN/config.yaml, --dry-run, the metrics
sinks' copy) and the lock writer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ajet.config import load_config, to_yaml
from ajet.config.redact import REDACTED, redact_argv, redact_config
from ajet.errors import UserError
from ajet.training.run_dir import LOCK_FILE, prepare_run_dir


def _conf(tmp_path: Path, body: str, reader: str = "") -> Path:
    (tmp_path / "t.jsonl").write_text('{"task_id": "a", "question": "q"}\n')
    conf = tmp_path / "c.yaml"
    conf.write_text(f"project: {{name: p, exp_dir: {tmp_path / 'exp'}}}\nmodel: {{path: m}}\n"
                    f"task_reader: {{jsonl: {{train_path: t.jsonl}}{reader}}}\n" + body)
    return conf


def test_saved_config_hides_judge_keys_env_maps_and_argv_secrets(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: RUN/config.yaml (and the metrics sinks' copy, the same `to_yaml`) held
    judge.params.api_key, env_services.*.env values and vllm_servers.*.extra_args' --api-key
    verbatim; only serve.client_token and sandbox.service_token were redacted."""
    monkeypatch.setenv("AJET_TEST_JUDGE_KEY", "sk-from-the-environment-1")
    conf = _conf(tmp_path, (
        "judge: {type: none, params: {api_key: sk-judge-literal-2, headers: {Authorization: Bearer tok-3},\n"
        "        other_key: '${oc.env:AJET_TEST_JUDGE_KEY}', max_tokens: 64, model: gpt-x}}\n"
        "env_services:\n"
        "  kv: {command: 'python -m srv --port 9 --hf-token=hf-cmd-4', env: {OPENAI_API_KEY: sk-env-5, MODE: fast}}\n"
        "vllm_servers:\n"
        "  judge: {model: /m, extra_args: [--dtype, bfloat16, --api-key, sk-vllm-6, '--token=tok-7']}\n"),
        reader=", curriculum: {key: difficulty}")
    cfg = load_config(conf, require_workflow=False)
    assert cfg.judge.params["api_key"] == "sk-judge-literal-2"  # the run itself gets the values
    saved = (prepare_run_dir(cfg, resume=False) / "config.yaml").read_text()
    assert saved == to_yaml(cfg)  # what --dry-run prints and the metrics sinks upload
    for secret in ("sk-from-the-environment-1", "sk-judge-literal-2", "tok-3", "hf-cmd-4", "sk-env-5",
                   "sk-vllm-6", "tok-7"):
        assert secret not in saved, secret
    assert f"api_key: {REDACTED}" in saved and "${oc.env:AJET_TEST_JUDGE_KEY}" in saved
    assert "--api-key" in saved and "bfloat16" in saved and "max_tokens: 64" in saved
    assert "model: gpt-x" in saved and "key: difficulty" in saved  # names, not secrets, stay
    # names of environment variables and plurals stay: judge.group_rank.api_key_env, public_metadata_keys
    assert "api_key_env: OPENAI_API_KEY" in saved and "public_metadata_keys: []" in saved


def test_redact_argv_hides_the_values_of_secret_flags_and_overrides() -> None:
    argv = ["ajet", "serve", "--conf", "x.yaml", "serve.client_token=abc", "--api-key", "sk-1", "--token=t2",
            "--max-tokens", "512", "--api-key-env", "OPENAI_API_KEY", "judge.params.api_key=${oc.env:K}"]
    assert redact_argv(argv) == ["ajet", "serve", "--conf", "x.yaml", f"serve.client_token={REDACTED}",
                                 "--api-key", REDACTED, f"--token={REDACTED}", "--max-tokens", "512",
                                 "--api-key-env", "OPENAI_API_KEY", "judge.params.api_key=${oc.env:K}"]
    assert redact_config({"serve": {"client_token": "${file:~/.t}"}}) == {"serve": {"client_token": "${file:~/.t}"}}
    assert redact_config({"token": "${oc.env:T,''}", "api_key": "${oc.env:K,sk-default}"}) == {
        "token": "${oc.env:T,''}", "api_key": REDACTED}  # a default may be the secret itself


def test_the_lock_file_and_its_in_use_error_keep_argv_secrets_out(tmp_path: Path) -> None:
    """Before: RUN/.lock recorded the whole argv (`serve.client_token=...` included) and the
    second run's "in use" error printed it."""
    cfg = load_config(_conf(tmp_path, ""), require_workflow=False)
    run_dir = Path(cfg.project.exp_dir) / cfg.project.name
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from pathlib import Path; from ajet.training.run_dir import lock_run_dir; "
        f"lock_run_dir(Path({str(run_dir)!r})); print('locked', flush=True); time.sleep(60)"),
        "serve.client_token=client-secret-8", "--api-key", "sk-argv-9"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        recorded = (run_dir / LOCK_FILE).read_text()
        assert "client-secret-8" not in recorded and "sk-argv-9" not in recorded
        assert f"serve.client_token={REDACTED} --api-key {REDACTED}" in recorded
        with pytest.raises(UserError) as err:
            prepare_run_dir(cfg, resume=False)
        # a lock written by an older ajet (unredacted) is redacted when shown
        (run_dir / LOCK_FILE).write_text(f"pid {holder.pid}: ajet serve serve.client_token=old-secret-10\n")
        with pytest.raises(UserError) as old:
            prepare_run_dir(cfg, resume=False)
    finally:
        holder.kill()
        holder.wait()
    assert "in use by another run" in str(err.value) and "sk-argv-9" not in str(err.value)
    assert "old-secret-10" not in str(old.value) and f"serve.client_token={REDACTED}" in str(old.value)


def test_a_password_inside_a_url_is_hidden_wherever_it_is() -> None:
    """A judge's or service's URL with credentials (`https://user:pass@host`) was written as is."""
    from ajet.config.redact import REDACTED, redact_argv, redact_command, redact_config

    tree = {"judge": {"params": {"base_url": "https://bot:hunter2@llm.internal/v1"}},
            "env_services": {"kv": {"command": "python -m srv --db postgres://u:pw1@db/x"}},
            "vllm_servers": {"a": {"extra_args": ["--redis", "redis://:pw2@cache:6379/0"]}},
            "model": {"path": "http://mirror:8000/models/x"}}
    out = str(redact_config(tree))
    assert not any(secret in out for secret in ("hunter2", "pw1", "pw2"))
    assert f"https://bot:{REDACTED}@llm.internal/v1" in out and "http://mirror:8000/models/x" in out
    assert redact_argv(["--url=http://a:b@c"]) == [f"--url=http://a:{REDACTED}@c"]
    assert "pw" not in redact_command("run --db postgres://u:pw@db")
