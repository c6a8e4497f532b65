"""The rules of werewolves, as one state class and plain functions (no model involved).

Two variants, named by the task's metadata["variant"]:
- "4" (the quick default): one werewolf, a seer, two villagers; at most one day.
- "9": three werewolves, three villagers, a seer, a witch and a hunter; at most five days.

A game alternates nights and days, night first.
- Night (`night_order`): the werewolves choose a victim (the player most named by the living
  werewolves), the seer learns whether one player is a werewolf, then the witch, told the
  victim, may save them (one save a game) or poison a player (one poison a game), one potion
  a night. At dawn the victim dies unless saved, and the poisoned player dies.
- Day: every survivor speaks once, then everyone votes; the most voted player is out (a tie
  is broken at random).
- The hunter, when the werewolves kill him or the village votes him out (not when poisoned),
  shoots one player, who dies too.
- After each night and each day (`Game.outcome`): the village wins when every werewolf is
  out; the werewolves win when they equal or outnumber the others, or when the last day
  ends without a winner.

A player's answer names its choice; one that names no valid player becomes a random valid
choice (a witch's: no potion), and is counted, so a game always ends.

A task is a seating: names in seating order with a variant's roles (`draw_players`), as a row
of a split (`seating_row`): make_data.py's splits and make_demos.py's own seatings.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WOLVES, VILLAGE = "werewolves", "village"
TEAM = {"werewolf": WOLVES, "villager": VILLAGE, "seer": VILLAGE, "witch": VILLAGE, "hunter": VILLAGE}
POTIONS = ("save", "poison")


@dataclass(frozen=True)
class Variant:
    roles: tuple[str, ...]  # one per seat
    max_days: int


VARIANTS = {
    "4": Variant(("werewolf", "seer", "villager", "villager"), max_days=1),
    "9": Variant(("werewolf",) * 3 + ("villager",) * 3 + ("seer", "witch", "hunter"), max_days=5),
}
NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy"]


def draw_players(rng: random.Random, roles: tuple[str, ...]) -> dict[str, str]:
    """A seating: names drawn from NAMES, in seating order, with the variant's roles shuffled."""
    return dict(zip(rng.sample(NAMES, len(roles)), rng.sample(roles, len(roles)), strict=True))


def seating_row(task_id: str, players: dict[str, str], variant: str) -> dict:
    """One task row of a seating."""
    return {
        "task_id": task_id,
        "question": f"A game of werewolves with {', '.join(players)}.",
        "variant": variant,
        "players": players,
    }


@dataclass(frozen=True)
class Death:
    name: str
    cause: str  # "killed" (by the werewolves), "poisoned", "voted" or "shot" (by the hunter)


@dataclass
class Game:
    roles: dict[str, str]  # player name -> role, in seating order
    max_days: int
    alive: list[str] = field(default_factory=list)
    day: int = 0  # days begun
    potions: set[str] = field(default_factory=lambda: set(POTIONS))  # the witch's unused ones
    # What the players chose, for `behaviour_metrics`.
    answers: Counter[str] = field(default_factory=Counter)  # role -> choices asked
    invalid: Counter[str] = field(default_factory=Counter)  # role -> answers naming no valid choice
    votes: list[tuple[str, str]] = field(default_factory=list)  # (voter, voted) by day
    # (role, question, the choice's place in the list asked from, the list's length)
    places: list[tuple[str, str, int, int]] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)  # whom the seer checked
    saves: list[str] = field(default_factory=list)
    poisons: list[str] = field(default_factory=list)
    shots: list[str] = field(default_factory=list)
    deaths: list[Death] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = set(self.roles.values()) - set(TEAM)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}; the roles are {sorted(TEAM)}")
        wolves = list(self.roles.values()).count("werewolf")
        if not 0 < wolves < len(self.roles) - wolves:
            raise ValueError(f"a game needs werewolves, fewer than the others: {self.roles}")
        self.alive = list(self.roles)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> Game:
        """The game of a task: metadata["variant"] (a key of VARIANTS) and metadata["players"]
        ({name: role}, the variant's roles in some order)."""
        variant = VARIANTS.get(str(metadata.get("variant")))
        if variant is None:
            raise ValueError(
                f"task metadata 'variant' must be one of {sorted(VARIANTS)}, got {metadata.get('variant')!r}")
        roles = dict(metadata["players"])
        if sorted(roles.values()) != sorted(variant.roles):
            raise ValueError(
                f"variant {metadata['variant']} has the roles {sorted(variant.roles)}, got {roles}")
        return cls(roles, variant.max_days)

    def players(self, role: str) -> list[str]:
        """The living players of `role`, in seating order."""
        return [n for n in self.alive if self.roles[n] == role]

    def others(self, name: str) -> list[str]:
        return [p for p in self.alive if p != name]

    def eliminate(self, name: str, cause: str) -> Death:
        self.alive.remove(name)
        self.deaths.append(Death(name, cause))
        return self.deaths[-1]

    def winner(self) -> str | None:
        wolves = len(self.players("werewolf"))
        if wolves == 0:
            return VILLAGE
        return WOLVES if wolves >= len(self.alive) - wolves else None

    def outcome(self) -> str | None:
        """The winning team once the game is over, else None."""
        return self.winner() or (WOLVES if self.day >= self.max_days else None)


def night_order(game: Game) -> list[str]:
    """The roles that act tonight, in order: the werewolves, the seer (if alive), the witch
    (if alive with a potion left). The werewolves and the seer do not depend on each other;
    the witch is told the werewolves' victim."""
    order = ["werewolf"] if game.players("werewolf") else []
    if game.players("seer"):
        order.append("seer")
    if game.players("witch") and game.potions:
        order.append("witch")
    return order


def kill_targets(game: Game) -> list[str]:
    return [n for n in game.alive if TEAM[game.roles[n]] != WOLVES]


def parse_choice(text: str, candidates: list[str]) -> str | None:
    """The candidate named first in `text` (whole word, any case), or None."""
    best: tuple[int, str] | None = None
    for name in candidates:
        match = re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), name)
    return best[1] if best else None


def choose(game: Game, who: str, text: str, candidates: list[str], rng: random.Random, question: str = "") -> str:
    """The player `who`'s answer names, or a random candidate when it names none (counted).
    With `question` ("kill", "vote"), where in `candidates` the choice was is kept (`places`)."""
    role = game.roles[who]
    game.answers[role] += 1
    choice = parse_choice(text, candidates)
    if choice is None:
        game.invalid[role] += 1
        choice = rng.choice(candidates)
    if question:
        game.places.append((role, question, candidates.index(choice), len(candidates)))
    return choice


def tally(votes: dict[str, str], rng: random.Random) -> str:
    """The most voted player; a tie is broken at random."""
    if not votes:
        raise ValueError("no votes to count")
    counts = Counter(votes.values())
    top = max(counts.values())
    return rng.choice(sorted(name for name, n in counts.items() if n == top))


Action = tuple[str, str | None]  # the witch's: ("save", victim), ("poison", name) or ("pass", None)


def parse_witch(text: str, victim: str, candidates: list[str], potions: set[str]) -> Action | None:
    """The witch's action: ("save", victim), ("poison", a candidate named after the word) or
    ("pass", None), by the first of these words in `text`; None when the answer is none of
    them or asks for a potion already used."""
    first = re.search(r"\b(save|poison|pass)\b", text, re.IGNORECASE)
    if first is None:
        return None
    kind = first.group(1).lower()
    if kind == "pass":
        return ("pass", None)
    if kind not in potions:
        return None
    if kind == "save":
        return ("save", victim)
    target = parse_choice(text[first.end():], candidates)
    return ("poison", target) if target else None


def witch_action(game: Game, who: str, text: str, victim: str) -> Action:
    """The witch's parsed action; an invalid answer uses no potion (counted)."""
    game.answers["witch"] += 1
    action = parse_witch(text, victim, game.others(who), game.potions)
    if action is None:
        game.invalid["witch"] += 1
        return ("pass", None)
    return action


def resolve_night(game: Game, victim: str, action: Action = ("pass", None)) -> list[Death]:
    """Dawn: the witch's potion is spent, the victim dies unless saved, the poisoned dies."""
    kind, target = action
    if kind in POTIONS:
        if kind not in game.potions:
            raise ValueError(f"the witch has no {kind} potion left")
        game.potions.remove(kind)
    if kind == "save" and target != victim:
        raise ValueError(f"the witch can only save the victim {victim}, not {target}")
    deaths = []
    if kind == "save":
        game.saves.append(victim)
    else:
        deaths.append(game.eliminate(victim, "killed"))
    if kind == "poison" and target is not None:
        game.poisons.append(target)
        if target in game.alive:  # poisoning the victim wastes the potion
            deaths.append(game.eliminate(target, "poisoned"))
    return deaths


def hunter_shoots(game: Game, death: Death) -> bool:
    """The hunter shoots when killed by the werewolves or voted out, not when poisoned or shot."""
    return game.roles[death.name] == "hunter" and death.cause in ("killed", "voted") and bool(game.alive)


def _mean(flags: list[bool]) -> float:
    return sum(flags) / len(flags)


def behaviour_metrics(game: Game) -> dict[str, float]:
    """What the players did, as rates (a rate is left out when its event never happened):
    werewolves_win, days, valid_choices (answers naming a valid choice), vote_hit/<role> (day
    votes against the other team: a werewolf for the village, a villager of any kind for the
    werewolves), check_hit/seer (checks that found a werewolf), save/witch (the witch used her
    save this game), poison_hit/witch and shot_hit/hunter (on a werewolf), vote_first/<role>
    (day votes for the first player of the voter's list, in seating order) and
    kill_last/werewolf (kills of the last player of the list)."""
    wolf = {n: TEAM[r] == WOLVES for n, r in game.roles.items()}
    out = {"werewolves_win": float(game.outcome() == WOLVES), "days": float(game.day)}
    asked = sum(game.answers.values())
    if asked:
        out["valid_choices"] = 1.0 - sum(game.invalid.values()) / asked
    for role in sorted(set(game.roles.values())):
        hits = [wolf[voter] != wolf[voted] for voter, voted in game.votes if game.roles[voter] == role]
        if hits:
            out[f"vote_hit/{role}"] = _mean(hits)
    for role in sorted({r for r, question, _, _ in game.places if question == "vote"}):
        out[f"vote_first/{role}"] = _mean([i == 0 for r, q, i, _ in game.places if (r, q) == (role, "vote")])
    kills = [i == n - 1 for r, q, i, n in game.places if q == "kill"]
    if kills:
        out["kill_last/werewolf"] = _mean(kills)
    if game.checks:
        out["check_hit/seer"] = _mean([wolf[n] for n in game.checks])
    if "witch" in game.roles.values():
        out["save/witch"] = float(bool(game.saves))
    if game.poisons:
        out["poison_hit/witch"] = _mean([wolf[n] for n in game.poisons])
    if game.shots:
        out["shot_hit/hunter"] = _mean([wolf[n] for n in game.shots])
    return out


def team_rewards(winner: str, roles: list[str]) -> dict[str, float]:
    """Each role's reward: 1 when its team won, else 0."""
    return {role: float(TEAM[role] == winner) for role in sorted(set(roles))}


def episode_reward(
    winner: str, roles: list[str], is_trainable: Callable[[str], bool]
) -> float | dict[str, float]:
    """The episode's reward. One team trained: 1 if it won, else 0. Both teams (self-play): a
    reward per role (`team_rewards`). A game none of whose roles is trained is refused."""
    teams = {TEAM[role] for role in roles if is_trainable(role)}
    if not teams:
        raise ValueError(f"none of this game's roles {sorted(set(roles))} is in trainable_targets")
    if len(teams) == 1:
        return float(teams.pop() == winner)
    return team_rewards(winner, roles)
