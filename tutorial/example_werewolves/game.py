"""The rules of a tiny werewolves game, as plain functions (no model involved).

Four players: one werewolf, one seer, two villagers. One night: the werewolf kills a
villager or the seer; the seer learns one player's role. One day: every survivor says one
sentence, then everyone votes; the player with most votes is eliminated (a tie is broken
at random). The village wins if the werewolf is eliminated, else the werewolves win.

A player's answer names its choice; an answer that names no valid player becomes a random
valid choice (and is counted), so a game always finishes.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

ROLES = ("werewolf", "seer", "villager", "villager")
TEAM = {"werewolf": "werewolves", "seer": "village", "villager": "village"}


@dataclass
class Game:
    roles: dict[str, str]  # player name -> role, in seating order
    alive: list[str] = field(default_factory=list)
    invalid_choices: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.roles.values()) - set(TEAM)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}; the roles are {sorted(TEAM)}")
        if list(self.roles.values()).count("werewolf") != 1:
            raise ValueError(f"a game needs exactly one werewolf, got {self.roles}")
        self.alive = list(self.roles)

    def player(self, role: str) -> str:
        return next(name for name, r in self.roles.items() if r == role)

    def others(self, name: str) -> list[str]:
        return [p for p in self.alive if p != name]

    def eliminate(self, name: str) -> None:
        self.alive.remove(name)

    def winner(self) -> str:
        return "werewolves" if self.player("werewolf") in self.alive else "village"


def parse_choice(text: str, candidates: list[str]) -> str | None:
    """The candidate named first in `text` (whole word, any case), or None."""
    best: tuple[int, str] | None = None
    for name in candidates:
        match = re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), name)
    return best[1] if best else None


def choose(game: Game, text: str, candidates: list[str], rng: random.Random) -> str:
    """The player `text` names, or a random candidate when it names none (counted)."""
    choice = parse_choice(text, candidates)
    if choice is None:
        game.invalid_choices += 1
        choice = rng.choice(candidates)
    return choice


def tally(votes: dict[str, str], rng: random.Random) -> str:
    """The most voted player; a tie is broken at random."""
    if not votes:
        raise ValueError("no votes to count")
    counts = Counter(votes.values())
    top = max(counts.values())
    return rng.choice(sorted(name for name, n in counts.items() if n == top))


def trained_team(is_trainable: Callable[[str], bool]) -> str:
    """The team whose roles are trained; the episode reward is that team's win.

    Training both teams at once would need one reward per role; refuse it clearly.
    """
    teams = {TEAM[role] for role in TEAM if is_trainable(role)}
    if len(teams) != 1:
        raise ValueError(
            f"trainable_targets must name roles of one team (werewolves: [werewolf]; village: "
            f"[seer, villager]); the trainable roles span {sorted(teams) or 'no team'}"
        )
    return teams.pop()
