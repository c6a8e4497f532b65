"""`build_judge`: `JudgeConfig` → a judge object (or None when the workflow gives rewards)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ajet.config.schema import BUILTIN_JUDGES, JudgeConfig
from ajet.judge.base import JudgeError

# The built-in judges by name -> "module:Class", imported only when chosen. The names are
# `ajet.config.schema.BUILTIN_JUDGES` (the one list, which config validation reads too).
REGISTRY: dict[str, str] = {
    "math": "ajet.judge.math_judge:MathJudge",
    "exact_match": "ajet.judge.exact_match:ExactMatchJudge",
    "countdown": "ajet.judge.countdown:CountdownJudge",
    "llm": "ajet.judge.llm_judge:LLMJudge",
    "composite": "ajet.judge.composite:CompositeJudge",
    "group_rank": "ajet.judge.group_rank:GroupRankJudge",  # scores whole groups (see below)
}
assert set(REGISTRY) == set(BUILTIN_JUDGES) - {"none"}, "ajet.config.schema.BUILTIN_JUDGES and REGISTRY differ"
BUILTINS = tuple(REGISTRY)


def _builtin(name: str) -> type:
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_judge(cfg: JudgeConfig, *, llm_client_factory: Callable[[], Any] | None = None) -> Any:
    """The configured judge, instantiated with `cfg.params`; None for `type: none`.

    `llm_client_factory() -> openai.AsyncOpenAI`-like client (from the backbone) is passed to
    judges whose constructor accepts it (`llm`, `composite`, `group_rank`, custom judges that
    ask for it). `group_rank` is built from `cfg.group_rank` and scores groups, not episodes
    (`ajet.judge.group_rank`).
    """
    if cfg.type == "none":
        return None
    if cfg.type == "group_rank":  # configured by judge.group_rank; no per-episode compute_reward
        if cfg.params:
            raise JudgeError(f"judge.params {sorted(cfg.params)} is not read by judge.type=group_rank; "
                             "set judge.group_rank.<key> instead")
        return _builtin("group_rank")(cfg.group_rank, llm_client_factory=llm_client_factory)
    if cfg.type in BUILTINS:
        cls: Any = _builtin(cfg.type)
    elif ":" in cfg.type:
        cls = load_target(cfg.type)
    else:
        raise JudgeError(
            f"judge.type '{cfg.type}' is not one of {BUILTIN_JUDGES} nor "
            "'package.module:ClassName' / 'file.py:ClassName'"
        )
    params = dict(cfg.params or {})
    named, any_kwargs = _accepted_params(cls)
    unknown = set(params) - named
    if unknown and not any_kwargs:
        raise JudgeError(
            f"judge.params: unknown {sorted(unknown)} for judge '{cfg.type}'; "
            f"it accepts {sorted(named - {'llm_client_factory', 'client'})}"
        )
    if "llm_client_factory" in named:
        params["llm_client_factory"] = llm_client_factory
    judge = cls(**params)
    if not (hasattr(judge, "compute_reward") or hasattr(judge, "acompute_reward")):
        raise JudgeError(
            f"judge '{cfg.type}' has no compute_reward(task, output) -> (reward, is_success) "
            "(or async acompute_reward)"
        )
    return judge


def load_target(target: str) -> Any:
    """The object named by 'package.module:Name' or 'path/to/file.py:Name'."""
    module_part, _, name = target.rpartition(":")
    if module_part.endswith(".py"):
        path = Path(module_part)
        if not path.is_file():
            raise JudgeError(f"judge.type: file not found: {path}")
        digest = hashlib.sha1(str(path.resolve()).encode("utf-8")).hexdigest()[:10]
        module_name = f"ajet_judge_{path.stem}_{digest}"  # stable: picklable across processes
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            raise JudgeError(
                f"judge.type '{target}': cannot import '{module_part}' ({exc}); check the module "
                "path, or use 'path/to/file.py:ClassName'"
            ) from exc
    if not hasattr(module, name):
        raise JudgeError(f"judge.type '{target}': '{module_part}' has no '{name}'")
    return getattr(module, name)


def _accepted_params(cls: Any) -> tuple[set[str], bool]:
    """(keyword names `cls(...)` accepts, whether it also takes **kwargs)."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return set(), True
    params = signature.parameters.values()
    named = {
        p.name for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
