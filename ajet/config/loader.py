"""Load a run's config: schema defaults <- user YAML <- dotted CLI overrides.

Every failure becomes a `ConfigError` that names the file, the key's dotted path
and what would be valid; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Hashable
from enum import Enum
from pathlib import Path
from typing import get_type_hints

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from ajet.config.redact import redact_config
from ajet.config.schema import AjetConfig, EnvType, ReaderType
from ajet.config.validate import validate
from ajet.errors import ConfigError

# Keys holding file paths. In a YAML they are relative to the YAML's directory;
# in CLI overrides, relative to the current directory.
PATH_KEYS = (
    "task_reader.jsonl.train_path",
    "task_reader.jsonl.val_path",
    "task_reader.jsonl.test_path",
    "task_reader.hf_dataset.path",
    "task_reader.generate.cache_path",
    "sft.train_path",
    "sft.dev_path",
)
PATH_LIST_KEYS = ("task_reader.generate.documents",)

# Keys that were removed because another key does their job: a config that still sets one
# fails with what to write instead (rather than "unknown key").
REMOVED_KEYS = {
    "serve.private_metadata_keys": (
        "use serve.public_metadata_keys instead: the metadata keys a client sees (default none), "
        "so that no column of the data reaches a client unless named"
    ),
    "rollout.forced_call_schema_key": (
        "use rollout.tool_call_grammar instead: 'forced' (the default) decodes a forced call "
        "under the tool's JSON schema, its keys included"
    ),
    "serve.max_staleness": (
        "use rollout.max_staleness instead: the policy versions an episode may lag behind the weights "
        "it trains, for `ajet serve`'s clients as for the debug backbone's overlap (default 0: on-policy)"
    ),
    "sft.lr": (
        "use trainer.lr instead: the SFT stage trains with it; in a staged run, give the SFT "
        "stage its own with pipeline.overrides.sft.trainer.lr"
    ),
}


def load_config(
    conf_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    require_workflow: bool = True,
) -> AjetConfig:
    """Return the validated, typed config for a run."""
    cfg = OmegaConf.structured(AjetConfig)
    source = "defaults"
    if conf_path is not None:
        path = Path(conf_path)
        source = str(path)
        user = _read_yaml(path)
        _resolve_paths(user, base_dir=path.resolve().parent)
        cfg = _merge(cfg, user, source)
    if overrides:
        cfg = _merge(cfg, _parse_overrides(overrides), "command-line overrides")
    try:
        config: AjetConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except InterpolationResolutionError as exc:  # ${oc.env:UNSET}, ${a.missing.key}
        key = getattr(exc, "full_key", None) or "?"
        reason = str(exc).strip().splitlines()[0]
        raise ConfigError(f"{key} ({source}): cannot resolve its interpolation: {reason}. Set the environment "
                          "variable it names (or give ${oc.env:NAME,default}), or point it at an existing key.") from None
    _remember_env_values(cfg)
    if config.trainer.deterministic and config.rollout.seed is None:
        config.rollout.seed = config.project.seed  # every call samples with a seed of its own
    _expand_env(config)
    problems = validate(config, require_workflow=require_workflow)
    if problems:
        lines = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        raise ConfigError(f"invalid config ({source}):\n{lines}")
    return config


def _expand_env(config: AjetConfig) -> None:
    """With `env.type` set, the environment gives the tasks (`task_reader.type: env`, unless the
    YAML names another source: `validate` then refuses the pair) and, unless the YAML names its
    own, the workflow: its adapter's `ajet.envs.<type>:EnvWorkflow` (docs/environments.md)."""
    if config.env.type == EnvType.none:
        return
    if not config.workflow.target:
        config.workflow.target = f"ajet.envs.{config.env.type.value}:EnvWorkflow"
    reader = config.task_reader
    if reader.type == ReaderType.jsonl and not reader.jsonl.train_path:  # the default: no source named
        reader.type = ReaderType.env


def _read_secret_file(path: str) -> str:
    """`${file:PATH}`: the file's text, stripped (a token kept in a file, e.g. one only its owner
    reads, instead of on the command line or in the YAML)."""
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None


OmegaConf.register_new_resolver("file", _read_secret_file, replace=True)

# What ${oc.env:...} and ${file:...} interpolations resolved to (value -> the interpolation), so
# that a saved or uploaded config shows `${oc.env:API_TOKEN}`, never the token (`to_yaml`).
_env_values: dict[str, str] = {}


def _remember_env_values(cfg: DictConfig) -> None:
    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved = OmegaConf.to_container(cfg, resolve=True)

    def walk(a: object, b: object) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in a:
                walk(a[key], b.get(key))
        elif isinstance(a, list) and isinstance(b, list):
            for x, y in zip(a, b, strict=False):
                walk(x, y)
        elif isinstance(a, str) and ("${oc.env:" in a or "${file:" in a) and isinstance(b, str) and b:
            _env_values[b] = a

    walk(raw, resolved)


def to_yaml(config: AjetConfig) -> str:
    """The config as YAML, as it is shown, saved and uploaded (RUN/config.yaml, --dry-run, `ajet
    config`, the metrics sinks' copy): each value that came from an environment variable or a
    file written as its `${oc.env:...}` / `${file:...}` interpolation (resolved again where the
    config is loaded), and every other secret redacted (`ajet.config.redact`)."""
    tree = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)

    def unresolve(node: object) -> object:
        if isinstance(node, dict):
            return {k: unresolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [unresolve(v) for v in node]
        return _env_values.get(node, node) if isinstance(node, str) and node else node

    redacted = redact_config(unresolve(tree))
    assert isinstance(redacted, dict)  # a structured config's container is a mapping
    return OmegaConf.to_yaml(OmegaConf.create(redacted))


def defaults_yaml() -> str:
    """The shipped `configs/default.yaml`: every key with its default."""
    header = (
        "# Every ajet setting with its default. Generated from ajet/config/schema.py by\n"
        "# `ajet config --defaults`; a test keeps it identical. Copy what you change.\n"
    )
    return header + to_yaml(AjetConfig())


def _read_yaml(path: Path) -> DictConfig:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}. Pass an existing YAML with --conf.")
    if path.is_dir():
        raise ConfigError(f"--conf expects a YAML file, got a directory: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}:{exc.line}: duplicate key {exc.key!r} (first at {path}:{exc.first_line}); "
                          "the second would silently replace the first. Merge the two into one.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML ({problem}).") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections "
            f"(project:, model:, workflow:, ...), got {type(data).__name__}."
        )
    return OmegaConf.create(data)


class _DuplicateKey(Exception):
    def __init__(self, key: Hashable, line: int, first_line: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping: PyYAML keeps the last
    silently, so a second `trainer:` block replaced the first without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges are not duplicates
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, Hashable) and key in seen:
                raise _DuplicateKey(key, line, seen[key])
            if isinstance(key, Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _parse_overrides(overrides: list[str] | tuple[str, ...]) -> DictConfig:
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not key or key.startswith("-"):
            raise ConfigError(
                f"override '{item}' is not KEY=VALUE (example: trainer.total_steps=5)."
            )
    cfg = OmegaConf.from_dotlist(list(overrides))
    _resolve_paths(cfg, base_dir=Path.cwd())
    return cfg


def _resolve_paths(cfg: DictConfig, base_dir: Path) -> None:
    """Make relative data paths absolute against `base_dir`, in place."""
    for key in PATH_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            OmegaConf.update(cfg, key, str((base_dir / value).resolve()))
    for key in PATH_LIST_KEYS:
        values = OmegaConf.select(cfg, key, default=None)
        if values is not None and OmegaConf.is_list(values):
            resolved = [v if Path(str(v)).is_absolute() else str(base_dir / str(v)) for v in values]
            OmegaConf.update(cfg, key, resolved)
    # distill.teacher is a checkpoint directory or an endpoint URL (left as is).
    teacher = OmegaConf.select(cfg, "distill.teacher", default=None)
    if isinstance(teacher, str) and teacher and "://" not in teacher and not Path(teacher).expanduser().is_absolute():
        OmegaConf.update(cfg, "distill.teacher", str((base_dir / teacher).resolve()))
    # workflow.target / judge.type / env.gymnasium.renderer and task_args may name a file ("agent.py:MyWorkflow").
    for key in ("workflow.target", "judge.type", "env.gymnasium.renderer", "env.gymnasium.task_args"):
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str) and ".py:" in value:
            file_part, _, name = value.rpartition(":")
            if not Path(file_part).is_absolute():
                OmegaConf.update(cfg, key, f"{(base_dir / file_part).resolve()}:{name}")


def _merge(base: DictConfig, update: DictConfig, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, update)  # type: ignore[return-value]
    except ConfigKeyError as exc:
        raise ConfigError(_unknown_key_message(exc, source)) from None
    except ValidationError as exc:
        raise ConfigError(_wrong_type_message(exc, source)) from None
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(f"{source}: {key}: {_first_line(exc)}") from None


def _unknown_key_message(exc: ConfigKeyError, source: str) -> str:
    full_key = exc.full_key or str(getattr(exc, "key", "?"))
    if full_key in REMOVED_KEYS:
        return f"{source}: '{full_key}' was removed; {REMOVED_KEYS[full_key]}."
    parent, _, leaf = full_key.rpartition(".")
    valid = _valid_keys(parent)
    hint = ""
    close = difflib.get_close_matches(leaf, valid, n=1)
    if close:
        hint = f" Did you mean '{(parent + '.' if parent else '') + close[0]}'?"
    where = f"under '{parent}'" if parent else "at the top level"
    return (
        f"{source}: unknown key '{full_key}'.{hint}\n"
        f"  Valid keys {where}: {', '.join(valid) or '(none: this is a value)'}"
    )


def _wrong_type_message(exc: ValidationError, source: str) -> str:
    full_key = exc.full_key or "?"
    expected = _expected_type(full_key)
    detail = _first_line(exc).rstrip(".")
    message = f"{source}: {full_key}: {detail}."
    message += f" Expected {expected}." if expected else ""
    if expected == "str" and "'None'" in detail:
        # `key=` (or `key: null`) is null to OmegaConf, never the empty string.
        leaf = full_key.rpartition(".")[2]
        message += f" For an empty string write {leaf}: \"\" in YAML, or '{full_key}=\"\"' on the command line."
    return message


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def _schema_node(dotted: str) -> object:
    """The type the schema declares at `dotted` (a section's class, a field's type), or None."""
    node: object = AjetConfig
    for part in [p for p in dotted.split(".") if p]:
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in fields:
            return None
        node = _field_type(node, part)
    return node


def _field_type(cls: object, name: str) -> object:
    return get_type_hints(cls)[name]


def _valid_keys(parent: str) -> list[str]:
    node = _schema_node(parent)
    if node is None or not dataclasses.is_dataclass(node):
        return []
    return [f.name for f in dataclasses.fields(node)]


def _expected_type(full_key: str) -> str:
    node = _schema_node(full_key)
    if isinstance(node, type) and issubclass(node, Enum):
        return "one of: " + ", ".join(m.value for m in node)
    if isinstance(node, type):
        return node.__name__
    return str(node) if node is not None else ""
