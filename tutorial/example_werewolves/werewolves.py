"""Werewolves, advanced mode: one model per game role, only `trainable_targets` trained.

Each role gets its model from `tuner.register_model(role, default_model=...)`:
- a trainable role (here: werewolf) gets the policy; its calls are recorded and trained;
- another role gets `default_model`. Without one (the default) it also plays with the policy,
  on the same local engine, and its calls are recorded as context only (loss_mask 0, never
  trained). Set WEREWOLVES_OPPONENT_BASE_URL (+ _MODEL, _API_KEY) to have those roles played
  by a fixed model behind any OpenAI-compatible server instead (not recorded at all).

The episode reward is 1 when the trained team wins (game.trained_team), else 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any, ClassVar

from game import TEAM, Game, choose, tally, trained_team

from ajet import Workflow, WorkflowOutput, WorkflowTask

log = logging.getLogger(__name__)

RULES = (
    "You play a game of werewolves with {players}. There is one werewolf; the others are the "
    "village (a seer and villagers). At night the werewolf kills one player and the seer learns "
    "one player's role. By day everyone speaks once, then votes; the player with most votes is "
    "eliminated. The village wins if the werewolf is eliminated. You are {name}, the {role}."
)


def opponent_model() -> Any:
    """The model for roles that are not trained: None (the policy, recorded as context), or an
    AgentScope OpenAIChatModel when WEREWOLVES_OPPONENT_BASE_URL is set."""
    base_url = os.environ.get("WEREWOLVES_OPPONENT_BASE_URL", "")
    if not base_url:
        return None
    from agentscope.model import OpenAIChatModel

    return OpenAIChatModel(
        model_name=os.environ.get("WEREWOLVES_OPPONENT_MODEL", "opponent"),
        api_key=os.environ.get("WEREWOLVES_OPPONENT_API_KEY", "EMPTY"),
        stream=False,
        client_kwargs={"base_url": base_url, "max_retries": 0},
    )


class Player:
    """One seat: its own conversation with its role's model."""

    def __init__(self, name: str, role: str, model: Any, players: list[str]) -> None:
        self.name, self.role, self.model = name, role, model
        rules = RULES.format(players=", ".join(players), name=name, role=role)
        self.messages: list[dict[str, str]] = [{"role": "system", "content": rules}]

    async def ask(self, prompt: str) -> str:
        self.messages.append({"role": "user", "content": prompt})
        response = await self.model(self.messages)
        text = "".join(block["text"] for block in response.content if block["type"] == "text")
        self.messages.append({"role": "assistant", "content": text})  # as received: calls extend
        return text


class WerewolvesGame(Workflow):
    name: str = "werewolves"
    trainable_targets: ClassVar[list[str] | None] = ["werewolf"]

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        game = Game(dict(task.metadata["players"]))
        team = trained_team(tuner.is_trainable_role)
        opponent = opponent_model()
        models = {role: tuner.register_model(role, default_model=opponent) for role in TEAM}
        names = list(game.roles)
        players = {n: Player(n, r, models[r], names) for n, r in game.roles.items()}
        rng = random.Random()  # invalid answers and ties: chance, differing between episodes

        # Night: the werewolf and the seer act at the same time.
        wolf, seer = game.player("werewolf"), game.player("seer")
        targets = [n for n in names if n != wolf]
        kill_reply, check_reply = await asyncio.gather(
            players[wolf].ask(f"Night. Which player do you kill? Answer with one name from {targets}."),
            players[seer].ask(f"Night. Whose role do you want to learn? Answer with one name from {game.others(seer)}."),
        )
        victim = choose(game, kill_reply, targets, rng)
        checked = choose(game, check_reply, game.others(seer), rng)
        game.eliminate(victim)

        # Day: every survivor speaks once, then everyone votes.
        def morning(name: str) -> str:
            note = f" You learned that {checked} is the {game.roles[checked]}." if name == seer else ""
            return f"Day. {victim} was killed in the night.{note} Say one short sentence to the others."

        speeches = await asyncio.gather(*(players[n].ask(morning(n)) for n in game.alive))
        said = "\n".join(f"{n}: {s.strip()[:200]}" for n, s in zip(game.alive, speeches, strict=True))
        ballots = await asyncio.gather(*(
            players[n].ask(f"The others said:\n{said}\nVote: answer with one name from {game.others(n)}.")
            for n in game.alive
        ))
        votes = {n: choose(game, b, game.others(n), rng) for n, b in zip(game.alive, ballots, strict=True)}
        out = tally(votes, rng)
        game.eliminate(out)

        winner = game.winner()
        log.debug("task %s: %s killed, %s voted out, %s win", task.task_id, victim, out, winner)
        return WorkflowOutput(
            reward=1.0 if winner == team else 0.0,
            is_success=winner == team,
            metadata={"winner": winner, "killed": victim, "voted_out": out, "votes": votes},
            log_metrics={
                "werewolves_win": float(winner == "werewolves"),
                "invalid_choices": float(game.invalid_choices),
            },
        )

