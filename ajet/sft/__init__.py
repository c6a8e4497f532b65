"""Supervised fine-tuning on agent dialogs: data, loss masks, coreset, replay, schedule, recipe.

Importing this package is light; torch is loaded by `ajet.sft.step` / the recipe on use.
"""

from __future__ import annotations

from ajet.sft.coreset import DialogStats, dialog_stats, select_coreset
from ajet.sft.data import Dialog, DialogDataError, read_dialogs, split_dev
from ajet.sft.replay import ReservoirBuffer, mix_round, replay_count
from ajet.sft.schedule import Batch, mixture, plan_batches, split_rounds

__all__ = [
    "Batch",
    "Dialog",
    "DialogDataError",
    "DialogStats",
    "ReservoirBuffer",
    "dialog_stats",
    "mix_round",
    "mixture",
    "plan_batches",
    "read_dialogs",
    "replay_count",
    "select_coreset",
    "split_dev",
    "split_rounds",
]
