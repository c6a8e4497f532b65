"""The kill-anywhere harness (issue 52): a short training on the tiny model is stopped at every
phase of a step, with SIGINT, SIGTERM or SIGKILL, in-process and with the rollout overlapping the
update, then resumed, again and again, until it has trained every step. At the end:

- steps 1..N appear in metrics.jsonl exactly once;
- every task was trained once per epoch, with its `rollout.n` episodes (the task ids come from
  each step's token records);
- the optimizer's own step count is the number of updates logged;
- no checkpoint's label disagrees with what it holds (its step, its optimizer's step count).

The stops come from `ajet.faults` (`AJET_FAULT=<phase>@*:<SIGNAL>`: the first time the run
reaches the phase; an episode: of the next step to train), not from sleeps. A SIGINT/SIGTERM must stop cleanly: exit 130, the resume
hint, and every logged step committed. A SIGKILL may lose what was not committed, never more.
Runs start from a fork server (tests/integration/fork_server.py): one import of ajet for the
chain, not one per run. The tests are test_kill_anywhere_<mode>.py, one file per mode so that
the test workers share the matrix; which signal stops which phase: MODE_SHIFT below.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from ajet.faults import PHASES
from ajet.launcher import free_port
from tests.integration.test_debug_backbone import make_run

TOTAL_STEPS = 12  # 3 epochs: room for every phase's stop, each a step or two after the last
TOKEN = "kill-anywhere"
SERVE_STALENESS = 8
TASKS, BATCH, N = 8, 2, 2  # make_run's 8 tasks, 2 per step, 2 episodes each: an epoch is 4 steps
MODES = {
    "in_process": [],
    # --with-ray: the episodes run in Ray actors, and the driver's Ray (ray.init installs its own
    # SIGTERM handler) must not take the stop away from ajet's
    "ray": ["ray.num_rollout_workers=1", "--with-ray"],
    # in-process, each stop doubled (a second signal 0.2 s after the first: during the update it
    # waits for, or the checkpoint it waits to write) and every checkpoint file's write slowed
    # (AJET_FAULT_SLOW_WRITE_S), so that a stop racing a write lands inside it
    "double": [],
    "overlap": ["rollout.max_staleness=1", "rollout.engine_dtype=float16", "algorithm.tis_cap=2"],
    # `ajet serve` (rollout.max_staleness 8: the next steps' groups open before this one commits),
    # with two client threads that keep running episodes across the server's restarts and a slow
    # one, whose group completes late (the staleness bound lets its partners' early calls train)
    "serve": ["trainer.val_every=0", f"serve.client_token={TOKEN}", f"rollout.max_staleness={SERVE_STALENESS}",
              "algorithm.tis_cap=2"],
}
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
DOUBLE_SIGNALS = [signal.SIGINT, signal.SIGTERM]  # a second SIGKILL adds nothing
SLOW_WRITE_S = "0.3"
RAY_PHASES = ("episode", "rollout", "update", "updated", "commit")
# `make test` runs one chain a mode, its phases stopped by the three signals in turn, shifted by
# one from mode to mode (a Latin square): every signal stops every phase in one of the modes
# (but validation, which `ajet serve` has not: SIGTERM and SIGKILL stop it), and every mode sees
# every signal. AJET_KILL_MATRIX=full (`make test-kill-matrix`) runs the whole
# matrix instead, a chain per mode and signal (three times as long: ~20 min of worker time on
# the AVX2-only type).
MODE_SHIFT = {"in_process": 0, "overlap": 1, "serve": 2, "double": 0, "ray": 1}


def chains(mode: str) -> list[signal.Signals | None]:
    """The parameters of a mode's test: None (the signals in turn), or each signal alone."""
    if os.environ.get("AJET_KILL_MATRIX") != "full":
        return [None]
    return list(DOUBLE_SIGNALS if mode == "double" else SIGNALS)


def chain_id(signum: signal.Signals | None) -> str:
    return signum.name if signum is not None else "signals_in_turn"


class ForkServer:
    def __init__(self, cwd: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
        env.pop("AJET_FAULT", None)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fork_server.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=Path(__file__).parents[2])
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        self.cwd = cwd

    def ajet(self, *argv: str, fault: str = "", env: dict[str, str] | None = None, log: Path,
             timeout_s: int = 300) -> int:
        request = {"argv": list(argv), "env": {**(env or {}), **({"AJET_FAULT": fault} if fault else {})},
                   "cwd": str(self.cwd), "log": str(log), "timeout_s": timeout_s}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return int(json.loads(self.proc.stdout.readline())["rc"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def stop_at_every_phase_and_resume(tmp_path: Path, tiny_model_dir: Path, mode: str,
                                   only: signal.Signals | None = None) -> None:
    """One chain of stops of `mode`, a stop at every phase, then the checks: each stop by `only`,
    or (None) by SIGNALS in turn, starting MODE_SHIFT[mode] along."""
    conf = make_run(tmp_path, tiny_model_dir)
    run = tmp_path / "exp" / "tiny"
    # save_every=2: a stop after an odd step must save that step itself (save_on_stop), not find it saved
    args = ["--conf", str(conf), f"trainer.total_steps={TOTAL_STEPS}", "trainer.keep_checkpoints=100", "trainer.save_every=2",
            *MODES[mode]]
    # --with-ray starts a Ray instance per run (~20 s): its chain stops the phases where Ray's own
    # handler took the stop from ajet's (in the actors' rollout, around the update, in the write)
    phases = [p for p in PHASES if p in RAY_PHASES] if mode == "ray" else list(PHASES)
    clients = None
    if mode == "serve":
        port = free_port()
        args = ["serve", "--port", str(port), *args]
        phases.remove("validation")  # `ajet serve` does not validate (trainer.val_every=0)
        # and a slow agent, which waits HOLD_S after each begin: groups then complete out of the
        # order they were drawn in, and a step trains a group drawn for a later one
        clients = Clients(f"http://127.0.0.1:{port}", TOKEN, count=2, slow=1)
    server = ForkServer(tmp_path)
    double = mode == "double"
    signals = DOUBLE_SIGNALS if double else SIGNALS
    env = {"AJET_FAULT_SLOW_WRITE_S": SLOW_WRITE_S} if double else {}
    try:
        for index, phase in enumerate(phases):
            signum = only or signals[(PHASES.index(phase) + MODE_SHIFT[mode]) % len(signals)]
            log = tmp_path / f"run_{index}_{phase}_{signum.name}.log"
            resume = ["--resume"] if index else []
            # An episode of a step, not of the validation that a run from step 0 starts with. Around
            # the update: an even step, after an odd one that was logged but not checkpointed
            # (save_every=2), so that the stop must save that step from weights that are still its own.
            after_uncheckpointed = latest(run) + 2 + latest(run) % 2
            at = {"episode": f"{latest(run) + 1}+", "rollout": f"{after_uncheckpointed}+",
                  "update": f"{after_uncheckpointed}+", "updated": f"{after_uncheckpointed}+"}.get(phase, "*")
            rc = server.ajet(*args, *resume, fault=f"{phase}@{at}:{signum.name}{'x2' if double else ''}", env=env,
                             log=log)
            err = log.read_text()
            where = f"{mode}, {signum.name} at {phase}: exit {rc}\n{err[-3000:]}"
            if signum == signal.SIGKILL:
                assert rc == -signal.SIGKILL, where
            else:
                assert rc == 130, where
                assert f"ajet: stopped ({signum.name})" in err and "--resume" in err, where
                steps = train_steps(run)
                # A clean stop commits every step it logged. A second stop saves nothing more (a
                # checkpoint it interrupts is not written): like SIGKILL, it may leave logged steps
                # past the newest checkpoint, which the resume drops and trains again.
                if steps and not double:
                    assert latest(run) == steps[-1], where
            check_logged_once_and_checkpoints(run, where)
        log = tmp_path / "run_last.log"
        rc = server.ajet(*args, "--resume", log=log)
        assert rc == 0, log.read_text()[-3000:]
    finally:
        server.close()
        if clients is not None:
            clients.stop()

    assert train_steps(run) == list(range(1, TOTAL_STEPS + 1))
    check_logged_once_and_checkpoints(run, f"{mode}, {chain_id(only)}: the end")
    check_every_task_once_per_epoch(run, in_order=mode != "serve")
    assert (run / "final_model" / "config.json").is_file()
    updates = updates_logged(run, TOTAL_STEPS)
    assert optimizer_steps(run / "checkpoints" / f"step_{TOTAL_STEPS:06d}") == updates > 0


class Clients:
    """Agents of `ajet serve`: each thread begins an episode, makes one chat call, finishes it with
    a reward (the share of vowels in the reply), and retries whatever fails (the server is being
    killed and restarted under it); a slow one waits `HOLD_S` after it begins each episode."""

    HOLD_S = 2.0  # how long a slow client holds an episode before its call

    def __init__(self, url: str, token: str, count: int, slow: int = 0) -> None:
        import threading

        self.url, self.token = url, token
        self.stopping = threading.Event()
        self.finished = 0
        self.threads = [threading.Thread(target=self.work, args=(i >= count,), daemon=True)
                        for i in range(count + slow)]
        for thread in self.threads:
            thread.start()

    def work(self, slow: bool) -> None:
        import httpx

        from ajet.serve.client import EpisodeAPIError, EpisodeClient

        while not self.stopping.is_set():
            try:
                with EpisodeClient(self.url, self.token, timeout_s=30, wait_s=2) as client:
                    episode = client.begin()
                    if episode is None:  # this run ended; a resumed one may follow
                        self.stopping.wait(0.2)
                        continue
                    if slow:  # holds its group open; its call comes late, so it is not stale
                        self.stopping.wait(self.HOLD_S)
                    reply = httpx.post(f"{episode.base_url}/chat/completions", timeout=30,
                                       headers={"Authorization": f"Bearer {episode.api_key}"},
                                       json={"model": episode.model, "max_tokens": 8,
                                             "messages": [{"role": "user", "content": episode.task["main_query"]}]})
                    reply.raise_for_status()
                    text = reply.json()["choices"][0]["message"]["content"] or ""
                    client.finish(episode.episode_id, reward=sum(c in "aeiou" for c in text) / max(1, len(text)))
                    self.finished += 1
            except (httpx.HTTPError, EpisodeAPIError, KeyError, TypeError, ValueError):
                self.stopping.wait(0.2)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)


# ---------------------------------------------------------------------- checks


def train_rows(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == "train"]


def train_steps(run: Path) -> list[int]:
    return [r["step"] for r in train_rows(run)]


def latest(run: Path) -> int:
    pointer = run / "checkpoints" / "latest"
    return int(pointer.read_text().strip().removeprefix("step_")) if pointer.is_file() else 0


def updates_logged(run: Path, up_to: int) -> int:
    """Train steps up to `up_to` whose update ran (not skipped for lack of signal or a non-finite value)."""
    return sum(1 for r in train_rows(run) if r["step"] <= up_to and not r.get("actor/skipped_update"))


def optimizer_steps(ckpt: Path) -> int:
    import torch

    state = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)["state"]
    counts = {int(s["step"]) for s in state.values()}
    assert len(counts) <= 1, counts  # every parameter was stepped together
    return counts.pop() if counts else 0


def check_logged_once_and_checkpoints(run: Path, where: str) -> None:
    steps = train_steps(run)
    assert steps == list(range(1, len(steps) + 1)), f"{where}\nsteps logged: {steps}"
    for ckpt in sorted((run / "checkpoints").glob("step_*")):
        if not (ckpt / ".complete").is_file():
            continue
        import torch

        label = int(ckpt.name.removeprefix("step_"))
        state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
        assert state["step"] == label, f"{where}\n{ckpt} holds step {state['step']}"
        if label <= len(steps):  # its steps are logged (a SIGKILL may leave logged steps past the newest)
            assert optimizer_steps(ckpt) == updates_logged(run, label), (
                f"{where}\n{ckpt}: {optimizer_steps(ckpt)} optimizer steps, {updates_logged(run, label)} updates logged")


def check_every_task_once_per_epoch(run: Path, *, in_order: bool = True) -> None:
    """Each step trained BATCH groups of N episodes, and each task once per epoch: in the steps of
    that epoch (`in_order`), or, where a step trains the first complete groups and a slow client
    holds one into a later epoch's steps (`ajet serve`), once per epoch over the whole run."""
    episodes: dict[int, Counter] = {}  # per step: episodes per task
    groups: dict[int, Counter] = {}  # per step: episodes per (group, task)
    for step in range(1, TOTAL_STEPS + 1):
        records = run / "records" / f"step_{step:06d}.jsonl"
        rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
        distinct = {(r["group_id"], r["task_id"], r["episode_id"]) for r in rows}
        episodes[step] = Counter(task for _, task, _ in distinct)
        groups[step] = Counter((group, task) for group, task, _ in distinct)
    steps_per_epoch = TASKS // BATCH
    if not in_order:
        # A slow client's group of an earlier epoch may complete in the step that trains the same
        # task's group of this epoch: two groups of one task in a step. Count groups, not tasks.
        for step in groups:
            assert len(groups[step]) == BATCH and all(v == N for v in groups[step].values()), (step, groups[step])
        trained = Counter(task for step in groups for _, task in groups[step])
        epochs = TOTAL_STEPS // steps_per_epoch
        assert trained == Counter({f"t{i}": epochs for i in range(TASKS)}), f"the run: {trained}"
        return
    for epoch in range(TOTAL_STEPS // steps_per_epoch):
        window = range(epoch * steps_per_epoch + 1, (epoch + 1) * steps_per_epoch + 1)
        trained = Counter()
        for step in window:
            assert sum(episodes[step].values()) == BATCH * N and all(v == N for v in episodes[step].values()), (
                step, episodes[step])
            trained.update(episodes[step].keys())
        assert trained == Counter({f"t{i}": 1 for i in range(TASKS)}), f"epoch {epoch + 1}: {trained}"
