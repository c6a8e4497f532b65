"""`ajet serve` trains on the tiny model on episodes run by client processes: the Python agent
(`agent.py`) for two steps, and in a test of its own the Node.js agent (`agent.mjs`, official
`openai` npm package), which skips when Node, npm or npm's registry are not there; the Python
half never skips.

Checked (issue 18): the weights changed; every reply a client received is in the token records,
and the recorded completion decodes to exactly that reply; an aborted episode and a client that
vanished are counted, not trained on; a finished episode's key gets 401.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent

# A client that takes an episode, makes one call and disappears without finishing it.
VANISH = '''
import sys, httpx
from ajet.serve.client import EpisodeClient
episode = EpisodeClient(sys.argv[1], sys.argv[2]).begin()
reply = httpx.post(episode.base_url + "/chat/completions", headers={"Authorization": "Bearer " + episode.api_key},
                   json={"model": episode.model, "messages": [{"role": "user", "content": "hi"}]}, timeout=120)
print(episode.episode_id, reply.status_code)
'''


def node_agent_dir(tmp_path: Path) -> Path:
    """A copy of the Node agent with its `openai` package installed; skips when Node or npm are
    missing and cannot be installed, or the npm registry cannot be reached."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        apt = shutil.which("apt-get")
        if apt is None or os.geteuid() != 0:
            pytest.skip("node/npm are not installed and cannot be (needs apt-get as root): apt-get install nodejs npm")
        for args in ([apt, "update", "-q"], [apt, "install", "-y", "-q", "nodejs", "npm"]):
            done = subprocess.run(args, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.skip(f"installing nodejs/npm with apt-get failed: {done.stderr[-500:]}")
    agent = tmp_path / "node_agent"
    agent.mkdir()
    for name in ("agent.mjs", "package.json", "package-lock.json"):
        shutil.copy(HERE / name, agent / name)
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=agent, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        pytest.skip(f"`npm ci` could not install the openai npm package (registry unreachable?): {done.stderr[-500:]}")
    return agent


def write_run(tmp_path: Path) -> Path:
    conf = tmp_path / "run.yaml"
    conf.write_text((HERE / "remote_agent.yaml").read_text())
    return conf


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 300, what: str = "ajet serve") -> str:
    """`path`'s text once it has a complete line; fails if `proc` exits first."""
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and path.read_text().endswith(("\n", "}"))):
        assert proc.poll() is None, f"{what} exited {proc.returncode}: {proc.stderr.read()[-4000:]}"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)
    return path.read_text()


def completion_spans(record: dict) -> list[list[int]]:
    spans, current = [], []
    for token, trained in zip(record["input_ids"], record["loss_mask"], strict=True):
        if trained:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


@dataclass
class Served:
    """A running `ajet serve`: where clients reach it, its run dir, and the env for clients."""

    url: str
    token: str
    run: Path
    env: dict[str, str]


@contextmanager
def serving(tmp_path: Path, tiny_model_dir: Path, judge: str, *overrides: str) -> Iterator[Served]:
    """`ajet serve` on the tiny model (remote_agent.yaml, a vowel judge, the math tasks); after the
    block it must exit 0 by itself (the run is over), and it is killed if the block fails."""
    conf = write_run(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true", "PYTHONPATH": str(REPO)}
    serve = subprocess.Popen(
        [sys.executable, "-m", "ajet.cli.main", "serve", "--conf", str(conf), "--port", "0", "--quiet",
         f"model.path={tiny_model_dir}", f"project.exp_dir={tmp_path / 'exp'}", f"judge.type={judge}",
         *(f"task_reader.jsonl.{split}_path=" + str(REPO / f"tutorial/example_math_agent/{split}.jsonl")
           for split in ("train", "val", "test")),
         "rollout.n=4", "rollout.max_tokens=80", "rollout.episode_timeout_s=20", "trainer.batch_size=2",
         "trainer.lr=0.01", "trainer.save_every=0", "logging.tensorboard=false",
         "rollout.dynamic_sampling.enabled=false",  # these tests count every episode; tests/unit/test_remote_broker.py covers refills
         *overrides],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    run = tmp_path / "exp" / "remote_agent"
    try:
        info = json.loads(wait_for(run / "serve.json", serve))
        yield Served(info["base_url"].removesuffix("/v1"), info["client_token"], run, env)
        assert serve.wait(timeout=600) == 0, serve.stderr.read()[-4000:]
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(timeout=30)


def run_client(argv: list[str], served: Served, log: Path) -> None:
    """One agent process until the run has handed out all its episodes (HTTP 410)."""
    env = {**served.env, "AJET_URL": served.url, "AJET_TOKEN": served.token, "AJET_LOG": str(log)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err[-3000:]


def train_metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in rows if r["split"] == "train"]


def records_by_episode(run: Path, steps: int) -> dict[str, list[dict]]:
    by_episode: dict[str, list[dict]] = {}
    for step in range(1, steps + 1):
        for line in (run / "records" / f"step_{step:06d}.jsonl").read_text().splitlines():
            record = json.loads(line)
            by_episode.setdefault(record["episode_id"], []).append(record)
    return by_episode


def assert_replies_trained_exactly(log: Path, by_episode: dict[str, list[dict]], tiny_model_dir: Path) -> None:
    """Every reply the client logged is in the token records, and its recorded completion decodes
    to exactly that reply."""
    from transformers import AutoTokenizer

    replies = [json.loads(line) for line in log.read_text().splitlines()]
    assert replies, f"the client ran no episode ({log} is empty)"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = tokenizer.eos_token
    for reply in replies:
        assert reply["episode_id"] in by_episode, f"{reply['episode_id']} was not trained on"
        decoded = [tokenizer.decode(span, skip_special_tokens=False).removesuffix("<|im_end|>").removesuffix(eos)
                   for record in by_episode[reply["episode_id"]] for span in completion_spans(record)]
        assert reply["content"] in decoded, (reply, decoded)


@pytest.mark.tutorial
@pytest.mark.integration
def test_serve_two_steps_with_the_python_client(tmp_path: Path, tiny_model_dir: Path, vowel_judge: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from ajet.serve.client import EpisodeClient

    log = tmp_path / "python.jsonl"
    with serving(tmp_path, tiny_model_dir, vowel_judge, "trainer.total_steps=2") as served:
        client = EpisodeClient(served.url, served.token)
        assert client.status()["step"] in (0, 1)

        # One episode aborted by its client, one whose client vanishes, one finished here.
        aborted = client.begin()
        client.abort(aborted.episode_id, "the agent's sandbox crashed")
        vanish = subprocess.run([sys.executable, "-c", VANISH, served.url, served.token], capture_output=True,
                                text=True, env=served.env, timeout=300)
        assert vanish.returncode == 0 and vanish.stdout.split()[1] == "200", vanish.stderr[-2000:]
        vanished_id = vanish.stdout.split()[0]
        finished = client.begin()
        chat = {"model": finished.model, "messages": [{"role": "user", "content": "hi"}]}
        key = {"Authorization": f"Bearer {finished.api_key}"}
        assert httpx.post(f"{finished.base_url}/chat/completions", json=chat, headers=key, timeout=120).status_code == 200
        # The server has a judge: a client's own reward is refused (serve.client_reward=auto), and
        # the episode stays open for a finish the judge scores.
        refused = httpx.post(f"{served.url}/v1/episodes/{finished.episode_id}/finish", json={"reward": 1.0},
                             headers={"Authorization": f"Bearer {served.token}", "X-Episode-Key": finished.api_key})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "client_reward_refused"
        client.finish(finished.episode_id, metadata={"final_answer": "aeiou"})
        assert httpx.post(f"{finished.base_url}/chat/completions", json=chat, headers=key, timeout=30).status_code == 401

        run_client([sys.executable, str(HERE / "agent.py")], served, log)

    train = train_metrics(served.run)
    assert [r["step"] for r in train] == [1, 2]
    assert sum(r.get("rollout/failed/aborted", 0) for r in train) == 1
    assert sum(r.get("rollout/timeouts", 0) for r in train) == 1
    assert sum(r["rollout/episodes"] for r in train) == 16  # 2 steps x 2 groups x n=4, all counted

    by_episode = records_by_episode(served.run, steps=2)
    assert aborted.episode_id not in by_episode and vanished_id not in by_episode
    assert finished.episode_id in by_episode
    assert_replies_trained_exactly(log, by_episode, tiny_model_dir)

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(served.run / "final_model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed after two steps"


@pytest.mark.tutorial
@pytest.mark.integration
def test_node_client_episodes_are_trained_exactly(tmp_path: Path, tiny_model_dir: Path, vowel_judge: str) -> None:
    """The Node agent alone does one step's episodes; may skip (tests/skip_allowlist.txt)."""
    node_dir = node_agent_dir(tmp_path)
    log = tmp_path / "node.jsonl"
    with serving(tmp_path, tiny_model_dir, vowel_judge, "trainer.total_steps=1") as served:
        run_client(["node", str(node_dir / "agent.mjs")], served, log)

    [train] = train_metrics(served.run)
    assert train["step"] == 1 and train["rollout/episodes"] == 8  # 2 groups x n=4
    assert_replies_trained_exactly(log, records_by_episode(served.run, steps=1), tiny_model_dir)
