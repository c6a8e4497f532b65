"""Token tracking, lossless merging, tree packing and budgets (DESIGN.md, "the heart").

Pure Python here; the torch side (`ajet.context.packed_forward`) is imported on use.
"""

from __future__ import annotations

from ajet.context.budget import apply_budget, call_budget
from ajet.context.diagnostics import check_prefix_preserving
from ajet.context.merge import merge_timelines, timelines_to_samples
from ajet.context.pack import PackedSequence, pack_samples, pack_stats
from ajet.context.tracker import ContextTracker
from ajet.context.types import LLMCall, Sample, Timeline
from ajet.context.weights import loss_weights

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
