"""Coreset selection: keep the SFT dialogs most worth training on. Pure functions.

Per-dialog metrics (`DialogStats`): difficulty = the model's mean loss per trained token
(a `loss` given in the record wins), token length, and lexical diversity = distinct
n-grams / n-grams of the dialog's tokens.

Strategies, each returning `size` dialog indices in selection order:
- `random`: a seeded random subset (in the order drawn).
- `loss_topk`: the highest-loss (hardest) dialogs, hardest first; ties by index.
- `diversity`: greedy set coverage of token n-grams: each pick adds the most n-grams
  not yet covered (so near-duplicates are skipped); ties by index.
- `hybrid`: greedy on `alpha * difficulty + (1 - alpha) * new n-grams`, both scaled to
  [0, 1] (difficulty min-max over the dataset, new n-grams by the largest dialog's count).

The greedy strategies use lazy evaluation: a dialog's gain can only shrink as coverage
grows, so a stale score is an upper bound and the result equals the plain greedy.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

STRATEGIES = ("none", "random", "loss_topk", "diversity", "hybrid")


@dataclass
class DialogStats:
    index: int
    length: int
    diversity: float  # distinct n-grams / n-grams
    loss: float | None = None  # mean NLL per trained token
    ngrams: frozenset = field(default_factory=frozenset, repr=False)


def ngram_set(tokens: Sequence[int], n: int) -> frozenset:
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    return frozenset(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def distinct_ratio(tokens: Sequence[int], n: int) -> float:
    """Distinct n-grams / n-grams (1.0 for a sequence without repeats, 0.0 when too short)."""
    total = len(tokens) - n + 1
    return len(ngram_set(tokens, n)) / total if total > 0 else 0.0


def dialog_stats(tokens: Sequence[Sequence[int]], losses: Sequence[float | None], n: int) -> list[DialogStats]:
    if len(tokens) != len(losses):
        raise ValueError(f"{len(tokens)} dialogs but {len(losses)} losses")
    return [
        DialogStats(index=i, length=len(t), diversity=distinct_ratio(t, n), loss=loss, ngrams=ngram_set(t, n))
        for i, (t, loss) in enumerate(zip(tokens, losses, strict=True))
    ]


def select_coreset(
    stats: Sequence[DialogStats], strategy: str, size: int, *, seed: int, hybrid_alpha: float = 0.5
) -> list[int]:
    """Indices of the selected dialogs, in selection order (all, in order, for `none` / size 0)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"coreset strategy {strategy!r} unknown; use one of {STRATEGIES}")
    n = len(stats)
    if strategy == "none" or size <= 0 or size >= n:
        return list(range(n))
    if strategy == "random":
        return random.Random(seed).sample(range(n), size)
    if strategy in ("loss_topk", "hybrid"):
        missing = [s.index for s in stats if s.loss is None]
        if missing:
            raise ValueError(f"coreset strategy {strategy} needs a loss for every dialog; missing for {missing[:5]}")
    if strategy == "loss_topk":
        return sorted(range(n), key=lambda i: (-float(stats[i].loss), i))[:size]  # type: ignore[arg-type]
    alpha = hybrid_alpha if strategy == "hybrid" else 0.0
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"hybrid_alpha must be in [0, 1], got {alpha}")
    return _greedy(stats, size, alpha)


def _greedy(stats: Sequence[DialogStats], size: int, alpha: float) -> list[int]:
    difficulty = _minmax([s.loss for s in stats]) if alpha > 0 else [0.0] * len(stats)
    scale = max((len(s.ngrams) for s in stats), default=0) or 1
    covered: set = set()

    def score(i: int) -> float:
        gain = len(stats[i].ngrams - covered) / scale
        return alpha * difficulty[i] + (1.0 - alpha) * gain

    heap = [(-score(i), i) for i in range(len(stats))]
    heapq.heapify(heap)
    chosen: list[int] = []
    while heap and len(chosen) < size:
        _, i = heapq.heappop(heap)
        fresh = (-score(i), i)
        if not heap or fresh <= heap[0]:
            chosen.append(i)
            covered |= stats[i].ngrams
        else:
            heapq.heappush(heap, fresh)
    return chosen


def _minmax(values: Sequence[float | None]) -> list[float]:
    vals = [float(v) for v in values if v is not None]
    lo, hi = min(vals), max(vals)
    if hi == lo:
        return [0.0] * len(values)
    return [(float(v) - lo) / (hi - lo) for v in values]  # type: ignore[arg-type]


def fill_losses(losses: Sequence[float | None],
                compute: Callable[[list[int]], Sequence[float]]) -> list[float | None]:
    """`losses` with the missing ones (None) filled by `compute(indices)`; given ones are kept."""
    todo = [i for i, loss in enumerate(losses) if loss is None]
    out = list(losses)
    if todo:
        for i, value in zip(todo, compute(todo), strict=True):
            out[i] = float(value)
    return out


def selection_summary(stats: Sequence[DialogStats], chosen: Sequence[int]) -> dict[str, float]:
    """Mean length / diversity / loss of all dialogs vs the selected ones (logged as metrics)."""
    out: dict[str, float] = {"coreset/total": float(len(stats)), "coreset/selected": float(len(chosen))}
    for name, group in (("all", list(stats)), ("selected", [stats[i] for i in chosen])):
        if not group:
            continue
        out[f"coreset/{name}/length"] = sum(s.length for s in group) / len(group)
        out[f"coreset/{name}/diversity"] = sum(s.diversity for s in group) / len(group)
        losses = [s.loss for s in group if s.loss is not None]
        if losses:
            out[f"coreset/{name}/loss"] = sum(losses) / len(losses)
    return out
