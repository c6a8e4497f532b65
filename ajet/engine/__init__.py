"""Inference: the engine contract, the local continuous-batching engine, chat formatting.

Names are imported lazily so that `import ajet.engine` does not pull in torch/transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ajet.engine.base import ChatRenderer, Completion, InferenceEngine, SamplingParams

_LAZY = {
    "LocalEngine": "ajet.engine.local",
    "PromptTooLongError": "ajet.engine.requests",
    "EngineClosedError": "ajet.engine.requests",
    "ChatFormat": "ajet.engine.chat",
    "ParsedReply": "ajet.engine.chat",
    "parse_completion": "ajet.engine.chat",
    "to_openai_message": "ajet.engine.chat",
}

__all__ = ["ChatRenderer", "Completion", "InferenceEngine", "SamplingParams", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ajet.engine' has no attribute {name!r}")
    return getattr(import_module(module), name)
