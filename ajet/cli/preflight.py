"""What `--dry-run` checks beyond the config itself, so that a dry run that passes means
the run starts: the workflow imports (its module, its class or function) and, with
`model.lora.per_role`, names trainable roles to give adapters to; a custom judge imports,
`model.path` resolves, its chat template keeps earlier turns' tokens (only the tokenizer is
loaded), and a distillation teacher directory is a checkpoint of the same vocabulary. Nothing
heavy is loaded: no model, no engine, no data.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ajet.algorithms.registry import EVAL_STAGE, get_algorithm
from ajet.config.schema import AjetConfig
from ajet.config.stages import needs_workflow, stage_names
from ajet.context.diagnostics import SHAPES, template_report
from ajet.engine.chat import ChatFormat
from ajet.errors import ConfigError
from ajet.judge.build import BUILTINS, load_target
from ajet.models.resolve import cache_root, check_model_path, checkpoint_at_hand
from ajet.rollout.workflow_loader import load_workflow, trainable_targets_of
from ajet.training.model import per_role_adapters


def preflight(cfg: AjetConfig) -> list[str]:
    """What the run would load first, checked; returns one line per check that passed.

    Raises the same user error the real run would (workflow, judge or model not found).
    """
    done = []
    if cfg.workflow.target and needs_workflow(cfg):
        workflow = load_workflow(cfg.workflow.target)
        done.append(f"workflow {cfg.workflow.target} loads ({type(workflow).__name__})")
        if cfg.model.lora.enabled and cfg.model.lora.per_role:
            roles = per_role_adapters(cfg.model.lora, trainable_targets_of(cfg.workflow.trainable_targets, workflow))
            done.append(f"model.lora.per_role: one adapter for each of {', '.join(roles)}")
    if cfg.judge.type != "none" and cfg.judge.type not in BUILTINS:
        load_target(cfg.judge.type)
        done.append(f"judge {cfg.judge.type} imports")
    check_model_path(cfg.model.path, cfg.model.cache_dir)
    done.append(f"model.path {cfg.model.path} found")
    if cfg.model.initial_path:
        check_model_path(cfg.model.initial_path, cfg.model.cache_dir, key="model.initial_path")
        done.append(f"model.initial_path {cfg.model.initial_path} found (what default_model='initial' serves)")
    if any(stage != EVAL_STAGE and get_algorithm(stage).teacher for stage in stage_names(cfg)):
        done.append(check_teacher(cfg))
    if cfg.sandbox.enabled:
        # the sandbox package (~15 ms, 7 modules): only when it is enabled, not for `ajet --help`
        from ajet.sandbox.shared import check

        done.append(check(cfg.sandbox))
    done.append(check_chat_template(cfg))
    return done


def check_chat_template(cfg: AjetConfig) -> str:
    """Does the model's chat template keep earlier turns' tokens when a turn is appended, for
    each message shape (`ajet.context.diagnostics.template_breaks`)? Only the tokenizer is
    loaded, once per tokenizer: the answer is kept under the cache dir, keyed by the tokenizer's
    files, since loading transformers takes seconds a --dry-run should not spend each time. A
    bundled model not converted yet is checked when the run starts."""
    checkpoint = checkpoint_at_hand(cfg.model.path, cfg.model.cache_dir)
    if checkpoint is None:
        return "chat template: checked when the run starts (the model is converted or fetched then)"
    if not any((checkpoint / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json")):
        return f"chat template: not checked (no tokenizer files in {checkpoint})"
    digest = hashlib.sha256(repr([shape for shape, *_ in SHAPES]).encode())
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            digest.update(name.encode() + (checkpoint / name).read_bytes())
    cached = cache_root(cfg.model.cache_dir) / "template_checks" / f"{digest.hexdigest()[:24]}.txt"
    if cached.is_file():
        return cached.read_text()
    from transformers import AutoTokenizer

    try:
        report = template_report(ChatFormat(AutoTokenizer.from_pretrained(checkpoint)))
    except (OSError, ValueError) as exc:  # no chat template, an unreadable tokenizer: the run would fail too
        raise ConfigError(f"model.path={cfg.model.path}: {exc}") from exc
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(report)
    os.replace(partial, cached)
    return report


# What decides how a checkpoint's chat renders and tokenizes.
TOKENIZER_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json", "tokenizer.json",
                   "special_tokens_map.json")


def check_teacher(cfg: AjetConfig) -> str:
    """`distill.teacher`: an endpoint is checked when the run starts (prompt logprobs, its
    tokenizer); a directory must be a checkpoint or a peft adapter, and a checkpoint's
    vocabulary size and bos/eos ids must be the model's where both config files are at hand
    (the tokenizers themselves are compared when the run loads them)."""
    teacher = cfg.distill.teacher
    if "://" in teacher:
        return f"distill.teacher {teacher}: an endpoint (prompt logprobs and tokenizer are checked at start)"
    path = Path(teacher).expanduser()
    if not path.is_dir():
        raise ConfigError(f"distill.teacher={teacher}: no such directory; give a Hugging Face checkpoint (e.g. an "
                          "earlier run's final_model/), a peft adapter directory, or a teacher endpoint URL")
    if (path / "adapter_config.json").is_file():
        return f"distill.teacher {teacher}: a peft adapter"
    if not (path / "config.json").is_file():
        raise ConfigError(f"distill.teacher={teacher}: not a checkpoint directory (no config.json, no "
                          "adapter_config.json); give a directory saved with save_pretrained, e.g. RUN/final_model")
    student = Path(cfg.model.path).expanduser() / "config.json"
    if student.is_file():
        theirs, ours = (json.loads(p.read_text()) for p in (path / "config.json", student))
        keys = ("vocab_size", "bos_token_id", "eos_token_id")
        diff = [f"{k}: {theirs.get(k)} vs the student's {ours.get(k)}" for k in keys if theirs.get(k) != ours.get(k)]
        if diff:
            raise ConfigError(f"distill.teacher={teacher}: the teacher does not share the student's vocabulary "
                              f"({', '.join(diff)}); give a teacher of the same model family (same tokenizer)")
    return f"distill.teacher {teacher}: a checkpoint"
