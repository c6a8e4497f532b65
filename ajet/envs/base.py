"""What every environment adapter shares: the splits and their seeds, the adapter's protocol,
loading the tasks, and the errors (an unknown id, a missing extra, an environment that fails).

An adapter never crashes a run for an episode's fault: an environment that raises, or returns
a malformed observation or reward, raises `EnvError` in the workflow, and the rollout runner
counts the episode as failed (`rollout/failed/workflow_error:EnvError`) and goes on.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

from ajet.config.schema import SPLIT_SEED_STRIDE, EnvConfig, EnvType
from ajet.errors import SetupError, TaskReaderError
from ajet.workflow import Workflow, WorkflowTask

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "val", "test")


class EnvError(RuntimeError):
    """The environment raised, or returned something malformed, during an episode: the episode
    fails (counted), the run goes on."""


@dataclass(frozen=True)
class Split:
    """One split's tasks: the k-th is built from seed `seed + k`."""

    name: str
    seed: int
    size: int


def splits(cfg: EnvConfig) -> list[Split]:
    """train, val and test, each from its own range of seeds (`SPLIT_SEED_STRIDE` apart, and
    sizes are bounded below it), so no task seed is in two splits."""
    sizes = (cfg.train_size, cfg.val_size, cfg.test_size)
    return [Split(name, cfg.seed + i * SPLIT_SEED_STRIDE, size)
            for i, (name, size) in enumerate(zip(SPLIT_NAMES, sizes, strict=True))]


class EnvAdapter(Protocol):
    """What a module `ajet.envs.<type>` provides."""

    EnvWorkflow: type[Workflow]

    def make_tasks(self, cfg: EnvConfig, splits: list[Split]) -> list[list[WorkflowTask]]:
        """The tasks of each split, in the order of `splits`; raises `TaskReaderError` for an
        unknown id or bad args, naming what would be valid."""
        ...


def adapter(env_type: EnvType) -> EnvAdapter:
    """The adapter module of `env_type` (`ajet.envs.<type>`: imported here, by name, so that the
    packages of the adapters not used are never imported)."""
    if env_type == EnvType.none:
        raise TaskReaderError("task_reader.type=env needs env.type (reasoning_gym or gymnasium) and env.id")
    return cast(EnvAdapter, importlib.import_module(f"ajet.envs.{env_type.value}"))


def drop_train_questions(env_id: str, split: Split, tasks: list[WorkflowTask], train_keys: set[str],
                         key: Callable[[WorkflowTask], str] = lambda t: t.main_query) -> list[WorkflowTask]:
    """A val or test split's tasks without those that are also train tasks (the same `key`: by default
    the question), logged: a held-out split holds no task trained on."""
    kept = [t for t in tasks if key(t) not in train_keys]
    if len(kept) < len(tasks):
        logger.warning("env %s: %d of %d %s tasks left out: each is also a train task", env_id,
                       len(tasks) - len(kept), len(tasks), split.name)
    return kept


def make_env_tasks(cfg: EnvConfig) -> tuple[list[WorkflowTask], list[WorkflowTask], list[WorkflowTask]]:
    """(train, val, test): the tasks of the environment `cfg` names."""
    train, val, test = adapter(EnvType(cfg.type)).make_tasks(cfg, splits(cfg))
    if not train:
        raise TaskReaderError(f"env {cfg.type.value}:{cfg.id} gave no train task (env.train_size={cfg.train_size})")
    return train, val, test


def import_optional(module: str, package: str) -> ModuleType:
    """Import an environment's package (heavy and optional: only the adapter that needs it does),
    or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there; one of its own dependencies is not
        raise SetupError(f"{package} is not installed: pip install 'ajet[envs]' (or pip install {package})") from None


def unknown_id(what: str, name: str, known: Iterable[str], key: str = "env.id") -> TaskReaderError:
    """The error for a name that is not installed: the close ones first, then every one there is."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return TaskReaderError(f"{key}={name!r} is not a {what} installed here.{hint} Installed ({len(names)}): "
                           f"{', '.join(names)}")


def load_function(target: str, key: str) -> Callable[..., Any]:
    """`package.module:function` or `/abs/path/file.py:function` (the loader made a YAML's
    relative path absolute) -> the function."""
    module_part, _, name = target.rpartition(":")
    if not module_part or not name:
        raise TaskReaderError(f"{key}={target!r} must be 'package.module:function' or 'file.py:function'")
    if module_part.endswith(".py"):
        path = Path(module_part)
        spec = importlib.util.spec_from_file_location(f"_ajet_env_{path.stem}", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise TaskReaderError(f"{key}={target!r}: file not found: {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_part)
        except ImportError as exc:
            raise TaskReaderError(f"{key}={target!r}: cannot import {module_part}: {exc}") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise TaskReaderError(f"{key}={target!r}: {module_part} has no function {name}")
    return cast(Callable[..., Any], function)


def reply_text(response: Any) -> str:
    """The text of a tuner's reply (an AgentScope `ChatResponse`: its text blocks, joined)."""
    return "".join(block["text"] for block in response.content if block.get("type") == "text")
