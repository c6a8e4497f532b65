"""Werewolves, advanced mode: AgentScope agents, one model per game role, only the roles in
`trainable_targets` trained.

Each seat is an AgentScope `ReActAgent` with the multi-agent formatter: its memory holds what
it has seen (the moderator's words to it, the others' speeches and votes), sent to the model
as one conversation history. Its model is its role's, from
`tuner.register_model(role, default_model=...)`; "role" is the game role, so all werewolves
share one model (one LoRA adapter with `model.lora.per_role`).
- A trainable role gets the policy; its calls are recorded and trained.
- Another role gets the workflow's `opponent`: None (`WerewolvesGame`) = the policy too, its
  calls recorded as context only (loss_mask 0, never trained); "initial" (`WerewolvesVsInitial`)
  = the frozen initial model, served by ajet's engine. Set WEREWOLVES_OPPONENT_CHECKPOINT to a
  local checkpoint directory to have ajet's engine serve that one instead (recorded as context),
  or WEREWOLVES_OPPONENT_BASE_URL (+ _MODEL, _API_KEY) for any model behind an OpenAI-compatible
  server (not recorded at all).

Choices (a kill, a check, a vote, the witch's potion, the hunter's shot) are AgentScope
structured output, as in the seed's game: the question goes to the seat's memory and its model is
called with `structured_model=` a pydantic model whose fields admit only the valid answers. ajet's
engine decodes that call under the schema (docs/grammar.md), so a choice is always valid and is
the model's own, not a random stand-in for an answer that named nobody. The seat then remembers
its choice as its reply. A model without grammar support (an external server) may still answer
off the schema: the answer is then parsed as free text, as the speeches are, and a choice that
names nobody is settled by chance (counted in workflow/valid_choices). Set
`structured_choices = False` on a subclass for the free-text questions of the earlier runs.

Reward (game.episode_reward): when one team is trained, 1 if it won, else 0; when both are
(self-play), a reward per role: 1 for the roles of the winning team, 0 for the others.
The rules are game.py's; the behaviour metrics are game.behaviour_metrics.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any, ClassVar, Literal

from game import (
    WOLVES,
    Action,
    Death,
    Game,
    behaviour_metrics,
    choose,
    episode_reward,
    hunter_shoots,
    kill_targets,
    night_order,
    resolve_night,
    tally,
    witch_action,
)

from ajet import Workflow, WorkflowOutput, WorkflowTask

log = logging.getLogger(__name__)

MODERATOR = "Moderator"
RULES = {
    "4": (
        "You play werewolves with {players}. One of you is the werewolf; the others are the "
        "village: a seer and two villagers. At night the werewolf kills a player and the seer "
        "learns whether one player is the werewolf. By day everyone speaks once, then votes; the "
        "player with most votes is out. The village wins if the werewolf is voted out, else the "
        "werewolf wins."
    ),
    "9": (
        "You play werewolves with {players}. Three of you are werewolves; the others are the "
        "village: three villagers, a seer, a witch and a hunter. Each night the werewolves kill a "
        "player, the seer learns whether one player is a werewolf, and the witch, told whom the "
        "werewolves attacked, may save them (once a game) or poison a player (once a game). Each "
        "day the survivors speak once, then vote; the player with most votes is out. The hunter, "
        "when killed or voted out, shoots a player. The village wins when every werewolf is out; "
        "the werewolves win when they are as many as the others, or if one is alive after day {max_days}."
    ),
}


def opponent_model(default: str | None) -> Any:
    """The default_model of the roles that are not trained: an AgentScope OpenAIChatModel on
    WEREWOLVES_OPPONENT_BASE_URL, else the directory WEREWOLVES_OPPONENT_CHECKPOINT, else `default`."""
    base_url = os.environ.get("WEREWOLVES_OPPONENT_BASE_URL", "")
    if not base_url:
        return os.environ.get("WEREWOLVES_OPPONENT_CHECKPOINT") or default
    from agentscope.model import OpenAIChatModel  # agentscope: heavy, imported where used

    return OpenAIChatModel(
        model_name=os.environ.get("WEREWOLVES_OPPONENT_MODEL", "opponent"),
        api_key=os.environ.get("WEREWOLVES_OPPONENT_API_KEY", "EMPTY"),
        stream=False,
        client_kwargs={"base_url": base_url, "max_retries": 0},
    )


def make_agent(name: str, model: Any, sys_prompt: str) -> Any:
    """One seat: a ReActAgent without tools (one model call a turn), multi-agent formatter."""
    from agentscope.agent import ReActAgent  # agentscope: heavy, imported where used
    from agentscope.formatter import OpenAIMultiAgentFormatter
    from agentscope.memory import InMemoryMemory

    agent = ReActAgent(name=name, sys_prompt=sys_prompt, model=model, formatter=OpenAIMultiAgentFormatter(),
                       memory=InMemoryMemory(), max_iters=1)
    agent.set_console_output_enabled(False)
    return agent


def system_prompt(game: Game, variant: str, name: str) -> str:
    role = game.roles[name]
    rules = RULES[variant].format(players=", ".join(game.roles), max_days=game.max_days)
    prompt = f"{rules} You are {name}, the {role}."
    wolves = game.players("werewolf")
    if role == "werewolf" and len(wolves) > 1:
        prompt += f" The werewolves are {', '.join(wolves)}."
    return prompt


def pick(question: str, candidates: list[str]) -> str:
    return f"{question} Answer with one name: {', '.join(candidates)}."


# A choice's call writes the tool-call markup around its answer (~32 tokens for a name, ~40 for
# the witch's), more than the speeches' rollout.max_tokens of 32.
CHOICE_MAX_TOKENS = 64


def name_choice(candidates: list[str]) -> type[Any]:
    """The structured answer to a question whose answer is one of `candidates`."""
    from pydantic import Field, create_model

    return create_model("Choice", name=(Literal[tuple(candidates)], Field(description="one player's name")))


def witch_choice(potions: set[str], others: list[str]) -> type[Any]:
    """The witch's structured answer: a potion she still has, or pass; `name` is whom to poison."""
    from pydantic import Field, create_model

    actions = (*sorted(potions), "pass")
    return create_model("WitchAction", action=(Literal[actions], Field(description="what you do")),
                        name=(Literal[tuple(others)], Field(description="whom to poison (only read with poison)")))


class Table:
    """The moderator of one game: asks the agents, tells each what it may know, applies the rules."""

    def __init__(self, game: Game, agents: dict[str, Any], rng: random.Random, structured: bool = True) -> None:
        self.game, self.agents, self.rng, self.structured = game, agents, rng, structured

    async def ask(self, name: str, text: str, answer: type[Any] | None = None) -> str:
        """What `name` answers to `text`: free text, or with `answer` (a pydantic model) its
        structured answer's fields joined into words ("poison Bob")."""
        from agentscope.message import Msg  # agentscope: heavy, imported where used

        agent, question = self.agents[name], Msg(MODERATOR, text, "user")
        if answer is None or not self.structured:
            # reply(), not agent(...): __call__ turns a cancellation (the episode's timeout) into a reply
            reply = await agent.reply(question)
            return reply.get_text_content() or ""
        # One call with the seat's own history, as the agent's reasoning step formats it (its
        # reply() would add a second call to say the choice in words).
        await agent.memory.add(question)
        prompt = await agent.formatter.format([Msg("system", agent.sys_prompt, "system"),
                                               *await agent.memory.get_memory()])
        response = await agent.model(prompt, structured_model=answer, max_tokens=CHOICE_MAX_TOKENS)
        fields = response.metadata or {}
        said = " ".join(str(fields[key]) for key in answer.model_fields if fields.get(key))
        if not said:  # a model that ignored the schema: its text is parsed like a speech
            said = " ".join(block.get("text", "") for block in response.content if block.get("type") == "text")
        await agent.memory.add(Msg(name, said, "assistant"))
        return said

    async def tell(self, names: list[str], text: str, speaker: str = MODERATOR) -> None:
        from agentscope.message import Msg  # agentscope: heavy, imported where used

        msg = Msg(speaker, text, "user" if speaker == MODERATOR else "assistant")
        for name in names:
            await self.agents[name].observe(msg)

    async def night(self) -> None:
        g, n = self.game, self.game.day + 1
        acting = night_order(g)
        wolves, targets = g.players("werewolf"), kill_targets(g)
        seers = g.players("seer") if "seer" in acting else []
        # The werewolves and the seer act at once: neither depends on the other.
        kills, checks = await asyncio.gather(
            asyncio.gather(*(self.ask(w, pick(f"Night {n}. Whom do you kill?", targets), name_choice(targets))
                             for w in wolves)),
            asyncio.gather(*(self.ask(s, pick(f"Night {n}. Whose role do you learn?", g.others(s)),
                                      name_choice(g.others(s))) for s in seers)),
        )
        named = {w: choose(g, w, text, targets, self.rng, "kill") for w, text in zip(wolves, kills, strict=True)}
        victim = tally(named, self.rng)
        if len(wolves) > 1:
            await self.tell(wolves, f"The werewolves kill {victim}.")
        for seer, text in zip(seers, checks, strict=True):
            checked = choose(g, seer, text, g.others(seer), self.rng)
            g.checks.append(checked)
            found = "a werewolf" if g.roles[checked] == "werewolf" else "not a werewolf"
            await self.tell([seer], f"{checked} is {found}.")
        action: Action = ("pass", None)
        if "witch" in acting:
            witch = g.players("witch")[0]
            answer = witch_choice(g.potions, g.others(witch))
            action = witch_action(g, witch, await self.ask(witch, self.witch_prompt(n, witch, victim), answer), victim)
        deaths = resolve_night(g, victim, action)
        died = ", ".join(d.name for d in deaths) or "nobody"
        await self.tell(list(g.roles), f"Night {n} is over. Died in the night: {died}.")
        await self.shots(deaths)

    def witch_prompt(self, night: int, witch: str, victim: str) -> str:
        options = []
        if "save" in self.game.potions:
            options.append(f"answer 'save' to save {victim}")
        if "poison" in self.game.potions:
            names = ", ".join(self.game.others(witch))
            options.append(f"answer 'poison' and a name ({names}) to poison that player")
        options.append("answer 'pass' to do nothing")
        return f"Night {night}. The werewolves attacked {victim}. You may use one potion: {'; '.join(options)}."

    async def day(self) -> None:
        g = self.game
        g.day += 1
        speakers = list(g.alive)
        speeches = await asyncio.gather(*(self.ask(s, f"Day {g.day}. Say one short sentence to the others.")
                                          for s in speakers))
        for speaker, speech in zip(speakers, speeches, strict=True):  # each hears the others' speeches
            await self.tell([s for s in speakers if s != speaker], speech.strip(), speaker=speaker)
        ballots = await asyncio.gather(*(self.ask(s, pick("Vote: who is out?", g.others(s)), name_choice(g.others(s)))
                                         for s in speakers))
        votes = {s: choose(g, s, b, g.others(s), self.rng, "vote") for s, b in zip(speakers, ballots, strict=True)}
        g.votes.extend(votes.items())
        out = tally(votes, self.rng)
        death = g.eliminate(out, "voted")
        said = ", ".join(f"{voter} voted {voted}" for voter, voted in votes.items())
        await self.tell(list(g.roles), f"{said}. {out} is out.")
        await self.shots([death])

    async def shots(self, deaths: list[Death]) -> None:
        """The hunter's shot, when one of `deaths` lets him shoot."""
        g = self.game
        for death in deaths:
            if hunter_shoots(g, death):
                text = await self.ask(death.name, pick("You are out. Whom do you shoot?", g.alive), name_choice(g.alive))
                target = choose(g, death.name, text, list(g.alive), self.rng)
                g.shots.append(target)
                g.eliminate(target, "shot")
                await self.tell(list(g.roles), f"The hunter {death.name} shot {target}.")


class WerewolvesGame(Workflow):
    name: str = "werewolves"
    trainable_targets: ClassVar[list[str] | None] = ["werewolf"]
    # The default_model of the roles that are not trained: None = the policy, recorded as context.
    opponent: ClassVar[str | None] = None
    # Choices as structured output (the module docstring); False = free text, as before 2026-11-26.
    structured_choices: ClassVar[bool] = True

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        game = Game.from_metadata(task.metadata)
        roles = sorted(set(game.roles.values()))
        episode_reward(WOLVES, roles, tuner.is_trainable_role)  # a config it cannot reward fails before playing
        opponent = opponent_model(self.opponent)
        models = {}
        for role in roles:  # a trained role plays the policy: it takes no default_model
            models[role] = tuner.register_model(role, default_model=None if tuner.is_trainable_role(role) else opponent)
        variant = str(task.metadata["variant"])
        agents = {name: make_agent(name, models[role], system_prompt(game, variant, name))
                  for name, role in game.roles.items()}
        # Invalid answers and ties are settled by chance, differing between episodes.
        table = Table(game, agents, random.Random(), structured=self.structured_choices)
        while game.outcome() is None:
            await table.night()
            if game.outcome() is None:
                await table.day()

        winner = game.outcome()
        reward = episode_reward(winner, roles, tuner.is_trainable_role)
        log.debug("task %s: %s win after %d days (%s)", task.task_id, winner, game.day, game.deaths)
        return WorkflowOutput(
            reward=reward,
            is_success=None if isinstance(reward, dict) else reward == 1.0,
            metadata={"winner": winner, "deaths": [[d.name, d.cause] for d in game.deaths], "votes": game.votes},
            log_metrics=behaviour_metrics(game),
        )


class WerewolvesVsInitial(WerewolvesGame):
    """The roles that are not trained play with the frozen initial model."""

    opponent: ClassVar[str | None] = "initial"
