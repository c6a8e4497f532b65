"""Where `ajet tinker` keeps what outlives it: one directory per training run (a training
client's model) under the state directory, its checkpoints inside.

```
STATE/runs/<model_id>/run.json                         base model, LoRA config, created
STATE/runs/<model_id>/weights/<name>/                  save_state: adapter + optimizer.pt + meta.json
STATE/runs/<model_id>/sampler_weights/<name>/          save_weights_for_sampler: adapter + meta.json
```

An adapter directory is peft's own format (`adapter_config.json`, `adapter_model.safetensors`),
so a sampler checkpoint also loads with `PeftModel.from_pretrained` or as a model of `ajet eval`.
The Tinker path of a checkpoint is `tinker://<model_id>/<weights|sampler_weights>/<name>`. A
checkpoint saved with `ttl_seconds` carries its expiry in meta.json and is deleted once it has
passed, before the next save, listing or load of that run (`CheckpointStore.sweep`), so an
expired checkpoint is never listed or loaded. A checkpoint is written into a temporary directory
and renamed into place, so a killed service leaves whole checkpoints or none; a restarted
service lists and loads every one (loading reads tensors only: safetensors, and
`torch.load(weights_only=True)` for the optimizer state).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ajet.files import write_json_atomic
from ajet.tinker_service.errors import BadRequestError, NotFoundError

KINDS = {"weights": "training", "sampler_weights": "sampler"}  # path segment -> Tinker's checkpoint_type
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")  # <session>:train:<n>


@dataclass(frozen=True)
class RunRecord:
    """What run.json holds: enough to list a run and to rebuild its adapter after a restart."""

    model_id: str
    base_model: str
    rank: int
    alpha: int
    train_mlp: bool
    train_attn: bool
    train_unembed: bool
    created: str
    user_metadata: dict[str, str]


@dataclass(frozen=True)
class CheckpointRef:
    model_id: str
    kind: str  # "weights" | "sampler_weights"
    name: str

    @property
    def tinker_path(self) -> str:
        return f"tinker://{self.model_id}/{self.kind}/{self.name}"


def parse_path(path: str) -> CheckpointRef:
    """`tinker://<model_id>/<weights|sampler_weights>/<name>`, or BadRequestError saying so."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in KINDS or not (_MODEL_ID.match(parts[0]) and _NAME.match(parts[2])):
        raise BadRequestError(f"{path!r} is not a checkpoint path of this service: "
                              "tinker://<model_id>/weights/<name> or tinker://<model_id>/sampler_weights/<name>")
    return CheckpointRef(parts[0], parts[1], parts[2])


def expiry(ttl_seconds: int | None) -> dict[str, str]:
    """The meta.json entry of a checkpoint saved with `ttl_seconds` (none without one)."""
    if ttl_seconds is None:
        return {}
    return {"expires_at": (datetime.now(timezone.utc) + timedelta(seconds=ttl_seconds)).isoformat()}


def _expired(meta: dict[str, Any], now: datetime) -> bool:
    """Past its `expires_at`; a meta.json without one, or with one that is not a timezone-aware
    ISO time (not written by this service), never expires."""
    expires = meta.get("expires_at")
    try:
        return isinstance(expires, str) and datetime.fromisoformat(expires) <= now
    except (ValueError, TypeError):  # unparsable, or naive (not comparable with an aware time)
        return False


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise BadRequestError(f"checkpoint name {name!r}: use letters, digits, '.', '_' and '-' "
                              "(up to 128, starting with a letter or digit)")
    return name


class CheckpointStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "runs").mkdir(parents=True, exist_ok=True)

    def run_dir(self, model_id: str) -> Path:
        return self.root / "runs" / model_id

    def add_run(self, record: RunRecord) -> None:
        self.run_dir(record.model_id).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run_dir(record.model_id) / "run.json", asdict(record))

    def run(self, model_id: str) -> RunRecord:
        path = self.run_dir(model_id) / "run.json"
        if not path.is_file():
            raise NotFoundError(f"no training run {model_id!r} in {self.root}")
        return RunRecord(**json.loads(path.read_text()))

    def runs(self) -> list[RunRecord]:
        return [self.run(p.name) for p in sorted((self.root / "runs").iterdir()) if (p / "run.json").is_file()]

    def directory(self, ref: CheckpointRef) -> Path:
        return self.run_dir(ref.model_id) / ref.kind / ref.name

    def existing(self, ref: CheckpointRef) -> Path:
        self.sweep(ref.model_id)
        path = self.directory(ref)
        if not (path / "meta.json").is_file():
            raise NotFoundError(f"no checkpoint {ref.tinker_path} (list them with "
                                f"RestClient.list_checkpoints({ref.model_id!r}))")
        return path

    def write(self, ref: CheckpointRef, fill: Any, meta: dict[str, Any], overwrite: bool = True) -> Path:
        """Write a checkpoint: `fill(tmp_dir)` writes its files, then it is renamed into place."""
        target = self.directory(ref)
        if target.exists() and not overwrite:
            raise BadRequestError(f"checkpoint {ref.tinker_path} exists (save with overwrite=True to replace it)")
        target.parent.mkdir(parents=True, exist_ok=True)
        self.sweep(ref.model_id)
        tmp = Path(tempfile.mkdtemp(prefix=f".{ref.name}-", dir=target.parent))
        try:
            fill(tmp)
            stamp = {"time": datetime.now(timezone.utc).isoformat(), "size_bytes": _size(tmp)}
            write_json_atomic(tmp / "meta.json", {**meta, **stamp})
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return target

    def checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        """The run's checkpoints as Tinker's `Checkpoint` objects (JSON), oldest first."""
        self.run(model_id)  # 404 for an unknown run
        self.sweep(model_id)
        found = []
        for kind, checkpoint_type in KINDS.items():
            for path in sorted((self.run_dir(model_id) / kind).glob("*/meta.json")):
                meta = json.loads(path.read_text())
                ref = CheckpointRef(model_id, kind, path.parent.name)
                found.append({"checkpoint_id": f"{kind}/{ref.name}", "checkpoint_type": checkpoint_type,
                              "time": meta["time"], "tinker_path": ref.tinker_path,
                              "size_bytes": meta.get("size_bytes"), "public": False,
                              "user_metadata": meta.get("user_metadata") or None,
                              "expires_at": meta.get("expires_at")})
        return sorted(found, key=lambda c: c["time"])

    def sweep(self, model_id: str) -> list[str]:
        """Delete the run's checkpoints whose `ttl_seconds` has passed; their Tinker paths."""
        now, gone = datetime.now(timezone.utc), []
        for kind in KINDS:
            for meta_path in sorted((self.run_dir(model_id) / kind).glob("*/meta.json")):
                try:
                    meta = json.loads(meta_path.read_text())
                except (OSError, ValueError):  # deleted or being replaced meanwhile
                    continue
                if _expired(meta, now):
                    shutil.rmtree(meta_path.parent, ignore_errors=True)
                    gone.append(CheckpointRef(model_id, kind, meta_path.parent.name).tinker_path)
        return gone


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
