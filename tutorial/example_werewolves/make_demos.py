"""Regenerate demos.jsonl: the werewolf's choices, for the SFT warm-up of
`werewolves_warmup.yaml`. Made from the TRAIN seatings and from seatings of a seed of their
own, never from val or test.

    python tutorial/example_werewolves/make_demos.py

A scripted werewolf plays the unchanged 4-player `WerewolvesGame` workflow: at night it kills
the LAST player of the list it is asked to choose from, and by day it votes the FIRST. Why
that rule: the frozen base model, playing the village, votes for the first player of its
list 78-81 % of the time whatever was said (125 train games, 2026-11-27; README.md). Then who
the werewolf kills decides who votes for whom: a werewolf in the second seat that kills the
first player (what the base model does 4 times in 5) leaves two villagers whose lists start
with it. The village of these demos is scripted too (a stock sentence each, a vote for the
first player of its list 4 times in 5): it only fills the history the werewolf reads.

Each of the werewolf's choices is one SFT dialog: the messages its kill or vote call sent
(AgentScope's multi-agent formatter: the system prompt and the game so far), the structured-
output tool, and the tool call naming its choice, as ajet's engine records such a call. Its
speeches are not demonstrated (the model keeps its own). Deterministic.
"""

from __future__ import annotations

import asyncio
import json
import random
import typing
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
DEMO_SEED = 40  # the extra seatings' seed (make_data's splits use 0, 1 and 2)
KILL, VOTE, CHECK = "Whom do you kill?", "Vote: who is out?", "Whose role do you learn?"
SPEECHES = ("I am a villager.", "I slept well and saw nothing.", "Let us think before we vote.",
            "I trust nobody yet.", "Good morning, everyone.")


def question(messages: list[dict]) -> str:
    """Which choice the last moderator question asks for (KILL, VOTE or CHECK)."""
    text = json.dumps(messages[-1].get("content"))
    found = {q: text.rfind(q) for q in (KILL, VOTE, CHECK)}
    asked, where = max(found.items(), key=lambda item: item[1])
    if where < 0:
        raise ValueError(f"no choice question in {text[-200:]!r}")
    return asked


def scripted_choice(asked: str, candidates: list[str]) -> str:
    """The werewolf's rule: kill the last of the list, vote the first."""
    return candidates[-1] if asked == KILL else candidates[0]


def win_chance(seat: int, kill: int, vote_first: float, p_first: float = 0.8) -> float:
    """The werewolf's chance to win a 4-player game from `seat` (0-3) when it kills the player
    of seat `kill` and votes the first of its list with chance `vote_first`, against a village
    whose two voters each vote the first of their lists with chance `p_first` (game.tally's
    rule: the most voted is out, a tie broken at random). The README's ceiling."""
    from itertools import product

    alive = [s for s in range(4) if s != kill]
    voters = [s for s in alive if s != seat]
    chance = 0.0
    for picks in product((0, 1), repeat=len(voters) + 1):  # 0: the first of the list
        *village, own = picks
        weight = vote_first if own == 0 else 1 - vote_first
        votes = [[s for s in alive if s != seat][own]]
        for voter, pick in zip(voters, village, strict=True):
            weight *= p_first if pick == 0 else 1 - p_first
            votes.append([s for s in alive if s != voter][pick])
        top = max(votes.count(s) for s in alive)
        tied = [s for s in alive if votes.count(s) == top]
        chance += weight * (1 - 1 / len(tied) if seat in tied else 1.0)
    return chance


class ScriptedModel:
    """An AgentScope chat model playing one role by rule; the werewolf's choices are recorded."""

    def __init__(self, role: str, rng: random.Random, record: list[dict]) -> None:
        self.role, self.rng, self.record = role, rng, record
        self.stream = False

    async def __call__(self, messages: list[dict], tools: Any = None, tool_choice: Any = None,
                       structured_model: Any = None, **kwargs: Any) -> Any:
        from agentscope.message import TextBlock, ToolUseBlock
        from agentscope.model import ChatResponse

        from ajet.tuner.model_tuner import STRUCTURED_TOOL_NAME

        if structured_model is None:  # a speech
            return ChatResponse(content=[TextBlock(type="text", text=self.rng.choice(SPEECHES))])
        candidates = list(typing.get_args(structured_model.model_fields["name"].annotation))
        asked = question(messages)
        if self.role == "werewolf":
            choice = scripted_choice(asked, candidates)
        else:  # the village: the first of its list 4 times in 5, as the base model
            choice = candidates[0] if self.rng.random() < 0.8 else self.rng.choice(candidates)
        arguments = json.dumps({"name": choice})
        if self.role == "werewolf":
            from agentscope._utils._common import _create_tool_from_base_model

            call_id = f"call_{len(self.record)}"
            self.record.append({
                "messages": json.loads(json.dumps(messages)),
                "tools": [_create_tool_from_base_model(structured_model, STRUCTURED_TOOL_NAME)],
                "reply": {"role": "assistant", "content": "", "tool_calls": [{
                    "id": call_id, "type": "function",
                    "function": {"name": STRUCTURED_TOOL_NAME, "arguments": arguments}}]},
                "asked": asked,
            })
        block = ToolUseBlock(type="tool_use", id=f"call_{self.rng.randrange(10**9)}", name=STRUCTURED_TOOL_NAME,
                             input={"name": choice}, raw_input=arguments)
        return ChatResponse(content=[block], metadata={"name": choice})


class ScriptedTuner:
    """Stands in for the tuner: every role gets a `ScriptedModel`; only the werewolf is trainable."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.record: list[dict] = []

    def is_trainable_role(self, role: str) -> bool:
        return role == "werewolf"

    def register_model(self, role: str, default_model: Any = None) -> Any:
        return ScriptedModel(role, self.rng, self.record)


async def demo(task: dict, rng: random.Random) -> list[dict]:
    """The werewolf's choices of one scripted game of `task`'s seating, as SFT dialogs."""
    from werewolves import WerewolvesGame

    from ajet import WorkflowTask

    tuner = ScriptedTuner(rng)
    await WerewolvesGame().execute(
        WorkflowTask(task_id=task["task_id"], main_query=task["question"], metadata=task), tuner)
    rows = []
    for call in tuner.record:
        kind = "kill" if call["asked"] == KILL else "vote"
        rows.append({"id": f"werewolves-{task['task_id']}-{kind}", "task_type": "werewolves",
                     "messages": [*call["messages"], call["reply"]], "tools": call["tools"]})
    return rows


def demo_tasks(count: int) -> list[dict]:
    """The train seatings, then seatings drawn from DEMO_SEED (as make_data draws them), none
    of them a val or test seating, up to `count`."""
    from game import VARIANTS, draw_players, seating_row

    def read(split: str) -> list[dict]:
        return [json.loads(line) for line in (HERE / f"{split}.jsonl").read_text().splitlines() if line.strip()]

    key = lambda players: tuple(players.items())  # noqa: E731 - a seating's identity
    held_out = {key(t["players"]) for split in ("val", "test") for t in read(split)}
    tasks = [t for t in read("train") if key(t["players"]) not in held_out]
    seen = {key(t["players"]) for t in tasks}
    rng, roles = random.Random(DEMO_SEED), VARIANTS["4"].roles
    while len(tasks) < count:
        players = draw_players(rng, roles)
        if key(players) in seen or key(players) in held_out:
            continue
        seen.add(key(players))
        tasks.append(seating_row(f"demo-{len(tasks)}", players, "4"))
    return tasks


def main(out: Path = HERE / "demos.jsonl", count: int = 128) -> Path:
    """Two dialogs (the kill and the vote) for each of `count` seatings."""
    rng = random.Random(0)
    rows = [row for task in demo_tasks(count) for row in asyncio.run(demo(task, rng))]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


if __name__ == "__main__":
    print(main())
