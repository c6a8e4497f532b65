"""Regenerate the seatings (deterministic): names and their roles, for both variants.

    python tutorial/example_werewolves/make_data.py

Each variant has three splits of distinct seatings: train (64, what the run trains on), val
(16, validated on during the run) and test (16, held out: never trained on nor used to choose
settings; report on it once, at the end). 4 players: train.jsonl, val.jsonl, test.jsonl;
9 players: train9.jsonl, val9.jsonl, test9.jsonl. It then runs make_demos.py (demos.jsonl, the
scripted werewolf's choices for werewolves_warmup.yaml, on train seatings and its own).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import make_demos  # the warm-up's seatings: the train ones first
from game import VARIANTS, draw_players, seating_row

SPLITS = (("train", 64), ("val", 16), ("test", 16))


def seatings(variant: str, seed: int) -> dict[str, list[dict]]:
    """The rows of each split; no seating (names in order with their roles) is in two splits."""
    roles = VARIANTS[variant].roles
    suffix = "" if variant == "4" else variant
    seen: set[tuple[tuple[str, str], ...]] = set()
    out: dict[str, list[dict]] = {}
    for offset, (split, count) in enumerate(SPLITS):
        rng = random.Random(seed + offset)
        rows = out[f"{split}{suffix}"] = []
        while len(rows) < count:
            players = draw_players(rng, roles)
            if tuple(players.items()) in seen:
                continue
            seen.add(tuple(players.items()))
            rows.append(seating_row(f"{split}{suffix}-{len(rows)}", players, variant))
    return out


def main() -> None:
    here = Path(__file__).parent
    for variant, seed in (("4", 0), ("9", 10)):
        for name, rows in seatings(variant, seed).items():
            (here / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    make_demos.main(here / "demos.jsonl")


if __name__ == "__main__":
    main()
