"""Token tracking, lossless merging, tree packing and budgets (docs/concepts.md: `ContextTracker`, Merge, Pack).

Pure Python: no torch (an import-linter contract). The torch side is `ajet.forward`.
"""

from __future__ import annotations

from ajet.context.budget import apply_budget, call_budget
from ajet.context.diagnostics import check_prefix_preserving
from ajet.context.loss_weights import loss_weights
from ajet.context.merge import merge_timelines, timelines_to_samples
from ajet.context.pack import PackedSequence, pack_samples, pack_stats
from ajet.context.tracker import ContextTracker
from ajet.context.types import LLMCall, Sample, Timeline

__all__ = [
    "ContextTracker",
    "LLMCall",
    "PackedSequence",
    "Sample",
    "Timeline",
    "apply_budget",
    "call_budget",
    "check_prefix_preserving",
    "loss_weights",
    "merge_timelines",
    "pack_samples",
    "pack_stats",
    "timelines_to_samples",
]
