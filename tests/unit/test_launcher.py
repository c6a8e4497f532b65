"""Launcher: env services start, answer their health check and are stopped on exit, on an
exception, on Ctrl-C and on SIGTERM; failures are clear; GPU queries; the CLI options."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from ajet.cli import train as train_cmd
from ajet.config import ConfigError
from ajet.config.schema import EnvServiceConfig, VllmServerConfig
from ajet.errors import LaunchError
from ajet.gpus import free_gpus, parse_nvidia_smi
from ajet.launcher import Launcher, free_port
from ajet.service_specs import ServiceSpec, env_service_specs, service_argv, vllm_service_specs
from tests.integration.cli import ajet as fork_ajet


def env_server(port: int, timeout_s: float = 60.0) -> ServiceSpec:
    return ServiceSpec(command=f"python -m ajet.task_reader.env_server --port {port}",
                       health_url=f"http://127.0.0.1:{port}/health", startup_timeout_s=timeout_s)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); treat it as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_env_service_starts_healthy_and_stops(tmp_path: Path) -> None:
    port = free_port()
    with Launcher(env_services={"kv": env_server(port)}, log_dir=tmp_path) as launcher:
        assert httpx.get(f"http://127.0.0.1:{port}/health").json()["status"] == "ok"
        # the service is usable: the reference env server lists its tasks
        tasks = httpx.post(f"http://127.0.0.1:{port}/list_tasks", json={"env_type": "kv_store"})
        assert tasks.status_code == 200 and tasks.json()["task_ids"]
        pid = launcher.children[0].proc.pid
    assert not pid_alive(pid) and not port_open(port)
    assert launcher.children == []


def test_services_are_stopped_when_the_body_raises_or_is_interrupted() -> None:
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        port = free_port()
        with pytest.raises(type(exc)):
            with Launcher(env_services={"kv": env_server(port)}) as launcher:
                pid = launcher.children[0].proc.pid
                raise exc
        assert not pid_alive(pid) and not port_open(port)


def test_service_that_exits_fails_clearly(tmp_path: Path) -> None:
    spec = ServiceSpec(command="python -c \"import sys; print('bad flag'); sys.exit(3)\"",
                       health_url="http://127.0.0.1:9/health", startup_timeout_s=30)
    with pytest.raises(LaunchError, match="exited with code 3") as info:
        with Launcher(env_services={"broken": spec}, log_dir=tmp_path):
            pass
    assert str(tmp_path / "broken.log") in str(info.value)
    assert "bad flag" in (tmp_path / "broken.log").read_text()


def test_unhealthy_service_times_out_and_is_stopped() -> None:
    port = free_port()
    # The standard library's file server starts in milliseconds (the env server imports ajet,
    # which took over 6 s on a loaded CI machine) and answers 404 for a path it does not have.
    spec = ServiceSpec(command=f"python -m http.server {port} --bind 127.0.0.1",
                       health_url=f"http://127.0.0.1:{port}/no-such-path", startup_timeout_s=6)
    launcher = Launcher(env_services={"kv": spec})
    with pytest.raises(LaunchError, match="not healthy .* HTTP 404"):
        launcher.__enter__()
    assert launcher.children == [] and not port_open(port)


SCRIPT = """
import signal, sys, time
from pathlib import Path
# A child inherits an ignored or blocked SIGINT from its parent (background jobs, libraries in the
# test process), and Python then never raises KeyboardInterrupt; restore a terminal's defaults.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
from ajet.launcher import Launcher
from ajet.service_specs import ServiceSpec
port, out = int(sys.argv[1]), Path(sys.argv[2])
spec = ServiceSpec(command=f"python -m ajet.task_reader.env_server --port {port}",
                   health_url=f"http://127.0.0.1:{port}/health")
try:
    with Launcher(env_services={"kv": spec}) as launcher:
        out.write_text(str(launcher.children[0].proc.pid))
        time.sleep(120)
except KeyboardInterrupt:
    out.write_text(out.read_text() + " interrupted")
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_the_services(tmp_path: Path, sig: signal.Signals) -> None:
    port, out = free_port(), tmp_path / "pid"
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "script.py"), str(port), str(out)])
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        service_pid = int(out.read_text())
        assert pid_alive(service_pid) and port_open(port)
        proc.send_signal(sig)
        assert proc.wait(timeout=90) == 0  # generous: the stop itself is bounded (10 s TERM + 5 s KILL)
    finally:
        proc.kill()
    assert out.read_text().endswith("interrupted")
    assert not pid_alive(service_pid) and not port_open(port)


def test_service_argv_uses_this_interpreter() -> None:
    assert service_argv("python -m x --port 1") == [sys.executable, "-m", "x", "--port", "1"]
    assert service_argv("node 'my server.js'") == ["node", "my server.js"]
    with pytest.raises(LaunchError):
        service_argv("  ")


def test_env_service_specs_pick_named_services() -> None:
    configured = {"kv": EnvServiceConfig(command="python -m s", health_url="http://h/health", env={"A": "1"}),
                  "empty": EnvServiceConfig()}
    specs = env_service_specs(configured, ["kv"])
    assert specs == {"kv": ServiceSpec(command="python -m s", health_url="http://h/health", env={"A": "1"})}
    assert env_service_specs(configured, []) == {}
    with pytest.raises(ConfigError, match="no env_services.web .*configured: empty, kv"):
        env_service_specs(configured, ["web"])
    with pytest.raises(ConfigError, match="env_services.empty.command is empty"):
        env_service_specs(configured, ["empty"])


def test_gpu_queries_are_parsed() -> None:
    text = "0, 500, 81920\n1, 70000, 81920\nbogus line\n"
    gpus = parse_nvidia_smi(text)
    assert gpus == [{"index": 0, "used_mib": 500, "total_mib": 81920},
                    {"index": 1, "used_mib": 70000, "total_mib": 81920}]
    assert free_gpus(0.1, gpus) == [0]
    assert free_gpus(0.9, gpus) == [0, 1]
    assert free_gpus(0.1, []) == []


def test_cli_with_env_unknown_name_exits_2(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(  # --dry-run imports it
        "from ajet import Workflow\n\n\nclass W(Workflow):\n    async def execute(self, t, m): ...\n")
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    conf = tmp_path / "run.yaml"
    conf.write_text("workflow: {target: agent.py:W}\ntask_reader: {jsonl: {train_path: train.jsonl}}\n"
                    "env_services: {kv: {command: python -m ajet.task_reader.env_server}}\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--with-env", "web", "--dry-run"])
    assert result.exit_code == 2 and "env_services.web" in result.output and "kv" in result.output
    ok = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--with-env", "kv", "--dry-run",
                                            "--with-ray-cluster", "10.0.0.1:6379"])
    assert ok.exit_code == 0, ok.output
    assert "address: 10.0.0.1:6379" in ok.output


@pytest.mark.integration  # two real CLI processes (torch import): slow on a loaded machine
def test_real_cli_without_gpu_has_no_traceback(stub_run_conf: Callable[..., Path]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    conf = stub_run_conf()
    for backbone in ("trinity", "verl"):
        out = fork_ajet("--conf", str(conf), f"--backbone={backbone}", timeout=120)
        assert out.returncode == 1, out.stderr
        assert "needs NVIDIA GPUs" in out.stderr and "--backbone=debug" in out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.integration
def test_cli_with_env_starts_the_service_for_the_run_and_stops_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The env-service tutorial trains one step against a server that only --with-env starts."""
    import json

    port = free_port()
    agent = Path(__file__).resolve().parents[2] / "tutorial" / "example_appworld" / "env_agent.py"
    conf = tmp_path / "run.yaml"
    conf.write_text(f"""
project: {{name: env, exp_dir: {tmp_path / 'exp'}}}
model: {{path: {tiny_model_dir}}}
workflow: {{target: {agent}:EnvServiceAgent}}
task_reader: {{type: env_service, env_service: {{base_url: "http://127.0.0.1:{port}", env_type: kv_store,
              num_train_tasks: 4, num_val_tasks: 0}}}}
rollout: {{n: 2, max_tokens: 8}}
trainer: {{total_steps: 1, batch_size: 2}}
logging: {{tensorboard: false}}
env_services:
  kv: {{command: "python -m ajet.task_reader.env_server --port {port}", health_url: "http://127.0.0.1:{port}/health"}}
""")
    out = fork_ajet("--conf", str(conf), "--with-env", "kv", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "service kv: healthy" in out.stderr and "stopped" in out.stderr
    rows = [json.loads(line) for line in (tmp_path / "exp" / "env" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["rollout/episodes"] == 4.0
    assert not port_open(port)


def test_vllm_server_specs_take_free_gpus_in_order() -> None:
    configured = {"judge": VllmServerConfig(model="/m/judge", port=8101, gpus=2, max_model_len=4096,
                                            extra_args=["--dtype", "bfloat16"]),
                  "npc": VllmServerConfig(model="/m/npc", port=8102),
                  "empty": VllmServerConfig()}
    specs = vllm_service_specs(configured, ["judge", "npc"], free=[1, 3, 4])
    judge, npc = specs["vllm-judge"], specs["vllm-npc"]
    assert service_argv(judge.command) == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/judge",
        "--served-model-name", "judge", "--host", "127.0.0.1", "--port", "8101",
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9", "--max-model-len", "4096",
        "--dtype", "bfloat16"]
    assert judge.env == {"CUDA_VISIBLE_DEVICES": "1,3"} and npc.env == {"CUDA_VISIBLE_DEVICES": "4"}
    assert judge.health_url == "http://127.0.0.1:8101/health" and "--max-model-len" not in npc.command
    with pytest.raises(LaunchError, match="needs 1 free GPU.*0 left of 2 free"):
        vllm_service_specs(configured, ["judge", "npc"], free=[0, 1])
    with pytest.raises(ConfigError, match="no vllm_servers.big .*configured: empty, judge, npc"):
        vllm_service_specs(configured, ["big"], free=[0])
    with pytest.raises(ConfigError, match="vllm_servers.empty.model is empty"):
        vllm_service_specs(configured, ["empty"], free=[0])


FAKE_VLLM_SERVER = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.environ["FAKE_VLLM_RECORD"], "w") as f:
    json.dump({"argv": sys.argv[1:], "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_vllm_server_runs_under_the_launcher_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's side of --with-vllm; a stand-in `vllm.entrypoints.openai.api_server`
    module (vLLM itself needs a GPU) records how it was started and answers /health."""
    import json

    server = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    (server / "api_server.py").write_text(FAKE_VLLM_SERVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(tmp_path / "record.json"))
    port = free_port()
    specs = vllm_service_specs({"judge": VllmServerConfig(model="/m/judge", port=port)}, ["judge"], free=[5])
    with Launcher(env_services=specs, log_dir=tmp_path / "logs") as launcher:
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        pid = launcher.children[0].proc.pid
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["gpus"] == "5" and record["argv"][record["argv"].index("--model") + 1] == "/m/judge"
    assert not pid_alive(pid) and not port_open(port)


def test_cli_with_vllm_without_vllm_installed_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    (tmp_path / "agent.py").write_text("")
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    conf = tmp_path / "run.yaml"
    conf.write_text("workflow: {target: agent.py:W}\ntask_reader: {jsonl: {train_path: train.jsonl}}\n"
                    "vllm_servers: {judge: {model: /m/judge}}\n")
    result = CliRunner().invoke(train_cmd.app, ["--conf", str(conf), "--with-vllm", "judge"])
    assert result.exit_code == 1, result.output
    assert "--with-vllm needs the vllm package" in result.output and "GPU=1" in result.output
    assert "Traceback" not in result.output


def test_a_service_already_healthy_is_reused_and_left_running(tmp_path: Path) -> None:
    port = free_port()
    with Launcher(env_services={"kv": env_server(port)}) as outer:
        first = outer.children[0].proc
        with Launcher(env_services={"kv": env_server(port)}, log_dir=tmp_path) as inner:
            assert inner.children == []  # nothing started: the running one answers /health
        assert first.poll() is None and port_open(port)  # the inner launcher left it alone
    assert not port_open(port)
