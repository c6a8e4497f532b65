"""The run directory `{project.exp_dir}/{project.name}` and its rules, for every recipe.

A new run refuses a directory that already holds an earlier run (checkpoints or logged
metrics; for a pipeline also its pipeline.json, stage dirs and eval reports, refused before
its first stage): pass `--resume` to continue it, `--fresh` to move it aside first
(`move_aside`: nothing is deleted), or choose another name. `--resume` means continue: it
refuses a run directory that does not exist. `config.yaml` records the resolved config
(written atomically: a kill never leaves half of it).

A run holds `RUN/.lock` (`fcntl.flock`) from `prepare_run_dir` until its process ends: two
runs in one directory would interleave metrics.jsonl and prune each other's checkpoints, so
the second is refused with the holder's pid and command (its secrets redacted: the lock file
is readable). The kernel frees the lock with the process, SIGKILL included: no stale lock is
ever left behind.

`--resume` refuses a config whose model, data files (their sha256) or batch shape differ from
the ones the run started with (`RUN/resume_keys.json`), naming each: resuming would continue
another run's optimizer state on other data. `--resume-changed` resumes anyway.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from ajet.config import to_yaml
from ajet.config.redact import redact_argv
from ajet.config.schema import AjetConfig
from ajet.errors import UserError
from ajet.files import file_sha256, write_text_atomic
from ajet.training.checkpoint_dir import cleanup_partial, latest_checkpoint


def run_dir_of(cfg: AjetConfig) -> Path:
    """Where a run writes its outputs."""
    return Path(cfg.project.exp_dir).expanduser() / cfg.project.name


# The run directories this process holds, and the open lock file of each.
_HELD: dict[Path, int] = {}
LOCK_FILE = ".lock"


def lock_run_dir(run_dir: Path) -> None:
    """Hold `run_dir`'s lock for the rest of this process (again: nothing); a run directory
    another process holds is refused with its pid and command."""
    key = run_dir.resolve()
    if key in _HELD:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # Redacted again: a lock written before argv was redacted may hold a token.
        holder = " ".join(redact_argv(os.pread(fd, 4096, 0).decode("utf-8", "replace").split())) or "a process"
        os.close(fd)
        raise UserError(
            f"{run_dir} is in use by another run ({holder}): two runs in one directory would mix their "
            "metrics and checkpoints. Wait for it to end or stop it, or choose another project.name / "
            "--exp-dir.") from None
    os.ftruncate(fd, 0)
    # The command without its secrets (`serve.client_token=...`, `--api-key X`): others may read it.
    os.pwrite(fd, f"pid {os.getpid()}: {' '.join(redact_argv(sys.argv))}\n".encode(), 0)
    _HELD[key] = fd


def prepare_run_dir(cfg: AjetConfig, *, resume: bool, backbone_checkpoints: str = "") -> Path:
    """Check the resume rules, lock the run directory, write config.yaml; return the run
    directory. `backbone_checkpoints`: a glob under the run directory where a GPU backbone keeps
    its own checkpoints (they count as an earlier run's, like ajet's `checkpoints/`)."""
    run_dir = run_dir_of(cfg)
    ckpt_root = run_dir / "checkpoints"
    # Owner-only from here: what the run writes (the config, records of the model's replies,
    # checkpoints, serve.json with the client token) is 0600, its directories 0700.
    os.umask(0o077)
    if resume and not run_dir.is_dir():
        raise UserError(
            f"--resume: {run_dir} does not exist, so there is no run to continue. Check project.name / "
            "--exp-dir, or drop --resume to start a new run.")
    lock_run_dir(run_dir)  # before anything is cleaned up or written: it may be another run's
    cleanup_partial(ckpt_root)
    metrics = run_dir / "metrics.jsonl"
    has_checkpoint = latest_checkpoint(ckpt_root) is not None or (
        bool(backbone_checkpoints) and any(p.is_dir() for p in run_dir.glob(backbone_checkpoints)))
    if not resume and (has_checkpoint or (metrics.is_file() and metrics.stat().st_size)):
        what = "checkpoints" if has_checkpoint else "metrics (metrics.jsonl)"
        raise UserError(
            f"{run_dir} already holds {what} of an earlier run. Pass --resume to continue it, "
            "--fresh to move it aside and start again, or choose another project.name / --exp-dir.")
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o700)  # a run directory made before (an earlier attempt, by hand) too
    keys = resume_keys(cfg)
    if resume and not cfg.project.resume_changed and (changes := resume_changes(run_dir, keys)):
        lines = "\n".join(f"  {key}: {then!r} in the run, {now!r} now" for key, then, now in changes)
        raise UserError(f"--resume: this config differs from the one {run_dir} was trained with:\n{lines}\n"
                        "Resuming would continue its optimizer state on another model, other data or another "
                        "batch shape. Restore those settings, start a new run (--fresh), or pass "
                        "--resume-changed to resume anyway.")
    write_text_atomic(run_dir / "config.yaml", to_yaml(cfg))
    write_text_atomic(run_dir / RESUME_KEYS_FILE, json.dumps(keys, indent=1, sort_keys=True) + "\n")
    return run_dir


RESUME_KEYS_FILE = "resume_keys.json"
# What a resumed run must share with the run it continues (the data files by content).
RESUME_KEYS = ("model.path", "model.lora.enabled", "model.lora.r", "model.lora.per_role", "algorithm.name",
               "trainer.batch_size", "rollout.n")
DATA_KEYS = ("task_reader.jsonl.train_path", "task_reader.jsonl.val_path", "sft.train_path")


def resume_keys(cfg: AjetConfig) -> dict[str, object]:
    """RESUME_KEYS' values, and the sha256 of each data file (DATA_KEYS) that exists."""
    def value(key: str) -> object:
        node: object = cfg
        for part in key.split("."):
            node = getattr(node, part)
        return getattr(node, "value", node)  # an enum: its value

    keys = {key: value(key) for key in RESUME_KEYS}
    for key in DATA_KEYS:
        path = Path(str(value(key))).expanduser()
        if str(value(key)) and path.is_file():
            keys[f"{key} (sha256)"] = file_sha256(path)[:16]
    return keys


def resume_changes(run_dir: Path, keys: dict[str, object]) -> list[tuple[str, object, object]]:
    """(key, the run's value, this config's) for each key that differs; none for a run written
    before resume_keys.json existed."""
    path = run_dir / RESUME_KEYS_FILE
    if not path.is_file():
        return []
    then = json.loads(path.read_text(encoding="utf-8"))
    return [(key, then.get(key), keys.get(key)) for key in sorted(set(then) | set(keys))
            if then.get(key) != keys.get(key)]


def earlier_pipeline_run(run_dir: Path) -> str:
    """What an earlier staged run left in `run_dir` ("" when nothing): its pipeline.json, a
    stage's run dir, or an eval stage's report (eval_NN_<label>.json; `ajet eval --name`'s own
    reports beside them are not a pipeline's)."""
    if (run_dir / "pipeline.json").is_file():
        return "a pipeline run (pipeline.json)"
    stages = run_dir / "stages"
    if stages.is_dir() and any(stages.iterdir()):
        return f"stage runs ({stages})"
    reports = sorted((run_dir / "eval").glob("eval_[0-9][0-9]_*.json")) if (run_dir / "eval").is_dir() else []
    return f"evaluations ({reports[0]})" if reports else ""


def refuse_earlier_pipeline_run(run_dir: Path, *, resume: bool) -> None:
    """Refuse a new staged run over an earlier one before any stage runs: its first eval stage
    would overwrite the earlier report and a later stage would refuse the earlier checkpoints."""
    what = "" if resume else earlier_pipeline_run(run_dir)
    if what:
        raise UserError(
            f"{run_dir} already holds {what} of an earlier run. Pass --resume to continue it, "
            "--fresh to move it aside and start again, or choose another project.name / --exp-dir.")


def move_aside(run_dir: Path) -> Path | None:
    """`--fresh`: rename a non-empty `run_dir` to `<run_dir>.<date-time>` (nothing is deleted);
    return the new path, or None when there was nothing to move."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    lock_run_dir(run_dir)  # refuses a live run's directory
    os.close(_HELD.pop(run_dir.resolve()))  # it moves away: nothing of ours is left there
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = run_dir.with_name(f"{run_dir.name}.{stamp}")
    suffix = 1
    while target.exists():
        target = run_dir.with_name(f"{run_dir.name}.{stamp}-{suffix}")
        suffix += 1
    run_dir.rename(target)
    return target
