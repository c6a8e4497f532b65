"""Evaluation of a model on a task split: reward, success, pass@k, tool selection, step efficiency.

`ajet.eval.metrics` is pure; `ajet.eval.runner.evaluate` runs the workflow (heavy imports on use).
"""

from __future__ import annotations

from ajet.eval.metrics import EpisodeResult, pass_at_k, summarize, tool_scores

__all__ = ["EpisodeResult", "pass_at_k", "summarize", "tool_scores"]
