"""Coreset strategies on hand-built dialogs: the right size and the right order."""

from __future__ import annotations

import pytest

from ajet.sft.coreset import (
    dialog_stats,
    distinct_ratio,
    fill_losses,
    select_coreset,
    selection_summary,
)

# Token sequences chosen so the bigram sets are easy to count by hand:
#   d0 {12,23,34} (3)   d1 = d0 (a duplicate)   d2 {56,67} (2)   d3 {12,29} (2)   d4 {88} (1, repeats)
TOKENS = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7], [1, 2, 9], [8, 8, 8]]
LOSSES = [0.5, 2.0, 1.0, 2.0, 0.1]


def stats(losses=LOSSES):
    return dialog_stats(TOKENS, list(losses), n=2)


def test_metrics_per_dialog() -> None:
    s = stats()
    assert [x.length for x in s] == [4, 4, 3, 3, 3]
    assert distinct_ratio([8, 8, 8], 2) == 0.5  # 1 distinct bigram of 2
    assert [x.diversity for x in s] == [1.0, 1.0, 1.0, 1.0, 0.5]
    assert distinct_ratio([1], 2) == 0.0


def test_loss_topk_is_hardest_first_ties_by_index() -> None:
    assert select_coreset(stats(), "loss_topk", 3, seed=0) == [1, 3, 2]


def test_diversity_greedy_covers_new_ngrams_and_skips_duplicates() -> None:
    # d0 (3 new; ties with d1, lower index wins) -> d2 (2 new) -> d3 (1 new: 29) -> d4 (1 new: 88);
    # the duplicate d1 adds nothing and comes last.
    assert select_coreset(stats(), "diversity", 4, seed=0) == [0, 2, 3, 4]
    assert select_coreset(stats(), "diversity", 5, seed=0) == [0, 1, 2, 3, 4]  # size >= n: all, in order


def test_hybrid_between_difficulty_and_diversity() -> None:
    # alpha=1 is pure difficulty; alpha=0 pure diversity.
    assert select_coreset(stats(), "hybrid", 3, seed=0, hybrid_alpha=1.0) == [1, 3, 2]
    assert select_coreset(stats(), "hybrid", 3, seed=0, hybrid_alpha=0.0) == [0, 2, 3]
    # alpha=0.5, difficulty min-max scaled (d1=d3=1.0, d2=0.4737, d0=0.2105, d4=0) and
    # new bigrams scaled by 3: step 1 d1: .5+.5=1.0 (d3: .5+.33); step 2 d3: .5+.5*1/3=.667
    # beats d2: .237+.333=.570 and d0 (now covered): .105; step 3 d2 .570.
    assert select_coreset(stats(), "hybrid", 3, seed=0, hybrid_alpha=0.5) == [1, 3, 2]
    # alpha=0.3 differs from both pure orders: d1 (.3+.7=1.0), then d2 (.142+.7*2/3=.609) over
    # d3 (.3+.7/3=.533, its 12 is covered), then d3.
    assert select_coreset(stats(), "hybrid", 3, seed=0, hybrid_alpha=0.3) == [1, 2, 3]


def test_random_is_seeded_distinct_and_sized() -> None:
    picks = select_coreset(stats(), "random", 3, seed=7)
    assert len(picks) == 3 and len(set(picks)) == 3 and set(picks) <= set(range(5))
    assert select_coreset(stats(), "random", 3, seed=7) == picks
    draws = {tuple(select_coreset(stats(), "random", 3, seed=s)) for s in range(20)}
    assert len(draws) > 1  # the seed matters


def test_none_or_size_zero_keeps_everything_in_order() -> None:
    assert select_coreset(stats(), "none", 2, seed=0) == [0, 1, 2, 3, 4]
    assert select_coreset(stats(), "loss_topk", 0, seed=0) == [0, 1, 2, 3, 4]


def test_loss_strategies_need_losses_and_unknown_strategy_fails() -> None:
    with pytest.raises(ValueError, match="needs a loss"):
        select_coreset(stats([None, 1.0, 1.0, 1.0, 1.0]), "loss_topk", 2, seed=0)
    with pytest.raises(ValueError, match="unknown"):
        select_coreset(stats(), "kmeans", 2, seed=0)


def test_record_losses_are_respected_and_only_missing_ones_are_computed() -> None:
    asked: list[list[int]] = []

    def compute(indices: list[int]) -> list[float]:
        asked.append(list(indices))
        return [10.0 + i for i in indices]

    assert fill_losses([0.5, None, 2.0, None], compute) == [0.5, 11.0, 2.0, 13.0]
    assert asked == [[1, 3]]
    assert fill_losses([1.0, 2.0], compute) == [1.0, 2.0] and len(asked) == 1  # nothing to compute


def test_selection_summary_compares_selected_with_all() -> None:
    summary = selection_summary(stats(), [1, 3])
    assert summary["coreset/selected"] == 2 and summary["coreset/total"] == 5
    assert summary["coreset/selected/loss"] == 2.0
    assert summary["coreset/all/loss"] == pytest.approx(sum(LOSSES) / 5)
    assert summary["coreset/selected/length"] == 3.5
