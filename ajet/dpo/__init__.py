"""Online DPO on agent rollouts: best-vs-worst pairs per task, exact micro-batched updates.

Light to import; torch loads in `ajet.dpo.step` / the recipe.
"""

from __future__ import annotations

from ajet.dpo.pairs import PairBatch, build_pair_batch

__all__ = ["PairBatch", "build_pair_batch"]
