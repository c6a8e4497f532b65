"""Werewolves: the rules of both variants (pure functions), whole games through the real
workflow and AgentScope agents with a scripted model, and one training step on the debug
backbone: only the werewolf trained (the village on the policy as context, or on an external
opponent model), and self-play with one LoRA adapter per trained role."""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli import ajet as fork_ajet

HERE = Path(__file__).parent
CALLS_PER_GAME = 8  # 4 players: night: werewolf + seer; day: 3 survivors speak, then 3 vote
WEREWOLF_CALLS = 3  # night kill, speech, vote (the werewolf always survives the night)
NINE = {"Ann": "werewolf", "Bo": "werewolf", "Cy": "werewolf", "Di": "villager", "Ed": "villager",
        "Fay": "villager", "Gus": "seer", "Hal": "witch", "Ivy": "hunter"}


@pytest.fixture
def g(monkeypatch: pytest.MonkeyPatch):
    """game.py (the tutorial's modules import each other by their file names)."""
    monkeypatch.syspath_prepend(str(HERE))
    import game

    return game


def nine(g: Any) -> Any:
    return g.Game.from_metadata({"variant": "9", "players": NINE})


# -- the rules --------------------------------------------------------------------------------
def test_choices_and_votes(g) -> None:
    game = g.Game({"Ann": "villager", "Bo": "werewolf", "Cy": "seer", "Di": "villager"}, max_days=1)
    assert game.players("werewolf") == ["Bo"] and game.others("Bo") == ["Ann", "Cy", "Di"]
    assert g.kill_targets(game) == ["Ann", "Cy", "Di"]
    assert g.parse_choice("I think cy, not Ann", ["Ann", "Cy"]) == "Cy"
    assert g.parse_choice("Annie did it", ["Ann", "Cy"]) is None  # whole words only
    rng = random.Random(0)
    assert g.choose(game, "Bo", "Di!", ["Ann", "Di"], rng) == "Di" and game.invalid["werewolf"] == 0
    assert g.choose(game, "Cy", "nobody", ["Ann", "Di"], rng) in ("Ann", "Di")
    assert game.invalid == {"seer": 1} and game.answers == {"werewolf": 1, "seer": 1}
    assert g.tally({"Ann": "Bo", "Cy": "Bo", "Di": "Ann"}, rng) == "Bo"
    assert {g.tally({"Ann": "Bo", "Bo": "Ann"}, random.Random(s)) for s in range(20)} == {"Ann", "Bo"}


def test_variants_and_seatings(g) -> None:
    assert sorted(g.VARIANTS["9"].roles) == sorted(["werewolf"] * 3 + ["villager"] * 3 + ["seer", "witch", "hunter"])
    assert nine(g).max_days == g.VARIANTS["9"].max_days and g.Game.from_metadata(
        {"variant": "4", "players": {"A": "seer", "B": "villager", "C": "werewolf", "D": "villager"}}).max_days == 1
    with pytest.raises(ValueError, match="variant 9 has the roles"):
        g.Game.from_metadata({"variant": "9", "players": {**NINE, "Ivy": "villager"}})
    with pytest.raises(ValueError, match="'variant' must be one of"):
        g.Game.from_metadata({"players": NINE})
    with pytest.raises(ValueError, match="fewer than the others"):
        g.Game({"Ann": "werewolf", "Bo": "seer"}, max_days=1)


def test_night_order(g) -> None:
    game = nine(g)
    assert g.night_order(game) == ["werewolf", "seer", "witch"]
    game.eliminate("Gus", "voted")  # the seer
    assert g.night_order(game) == ["werewolf", "witch"]
    game.potions.clear()  # a witch without potions has nothing to do
    assert g.night_order(game) == ["werewolf"]
    four = g.Game({"A": "werewolf", "B": "seer", "C": "villager", "D": "villager"}, max_days=1)
    assert g.night_order(four) == ["werewolf", "seer"]


def test_witch_saves_once_and_poisons_once(g) -> None:
    game = nine(g)
    assert g.resolve_night(game, "Di", ("save", "Di")) == [] and "Di" in game.alive and game.saves == ["Di"]
    assert g.parse_witch("save her", "Ed", ["Ed"], game.potions) is None  # the save is spent
    with pytest.raises(ValueError, match="no save potion left"):
        g.resolve_night(game, "Ed", ("save", "Ed"))
    assert g.parse_witch("I poison Bo tonight", "Ed", ["Ann", "Bo"], game.potions) == ("poison", "Bo")
    deaths = g.resolve_night(game, "Ed", ("poison", "Bo"))
    assert deaths == [g.Death("Ed", "killed"), g.Death("Bo", "poisoned")] and game.potions == set()
    assert g.parse_witch("poison Ann", "Fay", ["Ann"], game.potions) is None
    with pytest.raises(ValueError, match="no poison potion left"):
        g.resolve_night(game, "Fay", ("poison", "Ann"))
    # The first of save / poison / pass decides; an answer with none of them uses no potion.
    potions = {"save", "poison"}
    assert g.parse_witch("Pass. Do not save anyone", "Ed", ["Ann"], potions) == ("pass", None)
    assert g.parse_witch("save Ed, then poison Ann", "Ed", ["Ann"], potions) == ("save", "Ed")
    assert g.parse_witch("poison somebody", "Ed", ["Ann"], potions) is None
    fresh = nine(g)
    assert g.witch_action(fresh, "Hal", "hmm", "Di") == ("pass", None) and fresh.invalid == {"witch": 1}
    with pytest.raises(ValueError, match="only save the victim"):
        g.resolve_night(fresh, "Di", ("save", "Ed"))


def test_hunter_shoots_when_killed_or_voted_out_not_poisoned(g) -> None:
    game = nine(g)
    assert g.hunter_shoots(game, game.eliminate("Ivy", "killed"))
    assert g.hunter_shoots(game, g.Death("Ivy", "voted"))
    assert not g.hunter_shoots(game, g.Death("Ivy", "poisoned"))
    assert not g.hunter_shoots(game, g.Death("Di", "killed"))  # not the hunter


def test_win_conditions_and_the_day_limit(g) -> None:
    game = nine(g)
    assert game.winner() is None and game.outcome() is None
    for name in ("Ann", "Bo", "Cy"):
        game.eliminate(name, "voted")
    assert game.winner() == g.VILLAGE  # every werewolf out
    game = nine(g)
    game.eliminate("Di", "killed"), game.eliminate("Ed", "voted")
    assert game.winner() is None  # 3 werewolves, 4 others
    game.eliminate("Fay", "killed")
    assert game.winner() == g.WOLVES  # as many as the others
    game.alive = ["Ann", "Bo", "Gus"]
    assert game.winner() == g.WOLVES  # more than the others
    game = nine(g)
    game.day = game.max_days
    assert game.winner() is None and game.outcome() == g.WOLVES  # the last day ended
    for name in ("Ann", "Bo", "Cy"):
        game.eliminate(name, "shot")
    assert game.outcome() == g.VILLAGE


def test_behaviour_metrics(g) -> None:
    game = nine(g)
    game.day = 2
    game.votes = [("Ann", "Di"), ("Bo", "Cy"), ("Di", "Ann"), ("Ed", "Gus"), ("Gus", "Bo"), ("Gus", "Hal")]
    game.checks, game.poisons, game.shots = ["Ann", "Di"], ["Bo"], ["Ed"]
    game.answers.update({"werewolf": 3, "villager": 1})
    game.invalid.update({"werewolf": 1})
    for name in ("Ann", "Bo", "Cy"):
        game.eliminate(name, "voted")
    assert g.behaviour_metrics(game) == {
        "werewolves_win": 0.0, "days": 2.0, "valid_choices": 0.75,
        "vote_hit/werewolf": 0.5,  # Ann voted a villager, Bo a werewolf
        "vote_hit/villager": 0.5, "vote_hit/seer": 0.5,
        "check_hit/seer": 0.5, "save/witch": 0.0, "poison_hit/witch": 1.0, "shot_hit/hunter": 0.0,
    }
    four = g.Game({"A": "werewolf", "B": "seer", "C": "villager", "D": "villager"}, 1)
    four.day = 1
    four.eliminate("C", "killed")
    # The werewolf survived the last day: its team won; nothing was asked, there is no witch.
    assert g.behaviour_metrics(four) == {"werewolves_win": 1.0, "days": 1.0}
    # Where in its list each choice was: B and D vote the first of theirs, A the last it could kill.
    rng = random.Random(0)
    assert g.choose(four, "A", "D", ["B", "C", "D"], rng, "kill") == "D"
    for voter, text in (("B", "A"), ("D", "I vote A"), ("A", "D")):
        g.choose(four, voter, text, four.others(voter), rng, "vote")
    g.choose(four, "B", "C", ["A", "C", "D"], rng)  # a check: not kept
    assert four.places == [("werewolf", "kill", 2, 3), ("seer", "vote", 0, 2), ("villager", "vote", 0, 2),
                           ("werewolf", "vote", 1, 2)]
    metrics = g.behaviour_metrics(four)
    assert metrics["kill_last/werewolf"] == 1.0 and metrics["vote_first/werewolf"] == 0.0
    assert metrics["vote_first/seer"] == metrics["vote_first/villager"] == 1.0


def test_episode_reward(g) -> None:
    roles = ["werewolf", "seer", "villager", "villager"]
    assert g.episode_reward(g.WOLVES, roles, lambda role: role == "werewolf") == 1.0
    assert g.episode_reward(g.WOLVES, roles, lambda role: role in ("seer", "villager")) == 0.0
    assert g.episode_reward(g.VILLAGE, roles, lambda role: True) == {"seer": 1.0, "villager": 1.0, "werewolf": 0.0}
    with pytest.raises(ValueError, match="none of this game's roles"):
        g.episode_reward(g.WOLVES, roles, lambda role: role == "witch")


# -- whole games, real workflow and agents, scripted model --------------------------------------
def admitted(schema: dict) -> dict[str, list[str]]:
    """A choice schema's fields and the values each admits (a one-value Literal is a `const`)."""
    return {key: field.get("enum") or [field["const"]] for key, field in schema["properties"].items()}


class _ScriptedTuner:
    """Stands in for the ModelTuner: every role's model answers with a random candidate of the
    moderator's question (sometimes with nonsense), and every call is kept. With `schema`, a call
    with a `structured_model` answers as ajet's engine does: a random value the schema admits, in
    `response.metadata` (kept in `structured`)."""

    def __init__(self, trainable: set[str], seed: int, schema: bool = False) -> None:
        self.trainable, self.rng, self.schema = trainable, random.Random(seed), schema
        self.calls: list[tuple[str, list[dict]]] = []
        self.structured: list[tuple[str, dict[str, list[str]], int]] = []  # role, admitted values, max_tokens

    def is_trainable_role(self, role: str) -> bool:
        return role in self.trainable

    def register_model(self, role: str, default_model: Any = None) -> Any:
        from agentscope.message import TextBlock
        from agentscope.model import ChatModelBase, ChatResponse

        tuner = self

        class Scripted(ChatModelBase):
            async def __call__(self, messages: list[dict], tools: Any = None, tool_choice: Any = None,
                               structured_model: Any = None, **kwargs: Any) -> ChatResponse:
                tuner.calls.append((role, messages))
                if structured_model is not None and tuner.schema:
                    enums = admitted(structured_model.model_json_schema())
                    chosen = {key: tuner.rng.choice(values) for key, values in enums.items()}
                    tuner.structured.append((role, enums, kwargs.get("max_tokens", 0)))
                    return ChatResponse(content=[TextBlock(type="text", text="")], metadata=chosen)
                question = messages[-1]["content"][0]["text"].splitlines()[-2]
                names = re.findall(r"\w+", question.split("one name: ")[-1]) if "one name: " in question else []
                words = ["save", "pass", "poison " + tuner.rng.choice(list(NINE))] if "potion" in question else []
                answer = tuner.rng.choice([*names, *words, "I trust everyone here"])
                return ChatResponse(content=[TextBlock(type="text", text=answer)])

        return Scripted(model_name=role, stream=False)


def _play(variant_file: str, trainable: set[str], games: int, schema: bool = False
          ) -> list[tuple[Any, _ScriptedTuner, dict]]:
    from werewolves import WerewolvesGame

    from ajet import WorkflowTask

    rows = [json.loads(line) for line in (HERE / variant_file).read_text().splitlines()][:games]
    played = []
    for i, row in enumerate(rows):
        tuner = _ScriptedTuner(trainable, seed=i, schema=schema)
        task = WorkflowTask(task_id=row["task_id"], metadata=row)
        played.append((asyncio.run(WerewolvesGame().execute(task, tuner)), tuner, row))
    return played


@pytest.mark.parametrize("data", ["train.jsonl", "train9.jsonl"])
def test_games_end_and_players_see_only_what_they_may(g, data: str) -> None:
    everyone = {"werewolf", "villager", "seer", "witch", "hunter"}
    played = _play(data, everyone, games=12)
    for out, tuner, row in played:
        game = g.Game.from_metadata(row)
        assert out.metadata["winner"] in (g.WOLVES, g.VILLAGE)
        assert 1 <= out.log_metrics["days"] <= game.max_days
        assert out.reward == g.team_rewards(out.metadata["winner"], list(row["players"].values()))  # self-play
        assert 0.0 <= out.log_metrics["valid_choices"] <= 1.0
        wolves = [n for n, r in row["players"].items() if r == "werewolf"]
        for role, messages in tuner.calls:
            system, history = messages[0]["content"][0]["text"], messages[-1]["content"][0]["text"]
            assert history.startswith("# Conversation History")  # the multi-agent formatter
            knows_wolves = len(wolves) > 1 and f"The werewolves are {', '.join(wolves)}." in system
            assert knows_wolves == (role == "werewolf" and len(wolves) > 1)
            assert ("Whom do you kill?" in history) == (role == "werewolf")
            assert (" is a werewolf." in history or " is not a werewolf." in history) <= (role == "seer")
            assert ("You may use one potion" in history) <= (role == "witch")
    assert min(out.log_metrics["valid_choices"] for out, _, _ in played) < 1.0  # the script's nonsense counts


@pytest.mark.parametrize("data", ["train.jsonl", "train9.jsonl"])
def test_choices_are_structured_output_of_the_valid_answers(g, data: str) -> None:
    """Every choice is asked with a schema that admits only its valid answers; a model that keeps
    to it (ajet's engine) never makes an invalid choice."""
    played = _play(data, {"werewolf", "villager", "seer", "witch", "hunter"}, games=8, schema=True)
    kinds = set()
    for out, tuner, row in played:
        players = set(row["players"])
        assert out.log_metrics["valid_choices"] == 1.0
        assert tuner.structured  # every game has a night kill and a vote
        for _role, enums, max_tokens in tuner.structured:
            assert max_tokens >= 40  # room for the tool-call markup around the answer
            if "action" in enums:  # the witch: her potions left, or pass; whom to poison
                kinds.add("witch")
                assert "pass" in enums["action"] and set(enums["action"]) <= {"save", "poison", "pass"}
                assert set(enums["name"]) < players
            else:
                kinds.add("name")
                assert set(enums) == {"name"} and set(enums["name"]) <= players
        speeches = [m for role, m in tuner.calls if "Say one short sentence" in m[-1]["content"][0]["text"]]
        assert speeches, "speeches stay free text"
        votes = dict(out.metadata["votes"])
        assert all(voted in players and voted != voter for voter, voted in votes.items())
    assert "name" in kinds and (data == "train.jsonl" or "witch" in kinds)


def test_free_text_choices_stay_available(g) -> None:
    """`structured_choices = False`: the questions are free text again (the earlier runs')."""
    from werewolves import WerewolvesGame

    from ajet import WorkflowTask

    class FreeText(WerewolvesGame):
        structured_choices = False

    row = json.loads((HERE / "train.jsonl").read_text().splitlines()[0])
    tuner = _ScriptedTuner({"werewolf"}, seed=0, schema=True)
    asyncio.run(FreeText().execute(WorkflowTask(task_id=row["task_id"], metadata=row), tuner))
    assert tuner.calls and not tuner.structured


def test_one_trained_team_gets_one_reward(g) -> None:
    for out, _, _ in _play("train9.jsonl", {"werewolf"}, games=3):
        assert out.reward == float(out.metadata["winner"] == g.WOLVES) and out.is_success == (out.reward == 1.0)


# -- one training step on the debug backbone --------------------------------------------------
@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_trains_only_the_werewolf(one_step) -> None:
    run = one_step(HERE / "werewolves.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    ok = metrics["rollout/ok"]
    # Every role's calls were recorded (the village's as context)...
    assert metrics["context/calls"] == CALLS_PER_GAME * ok
    assert 0.0 <= metrics["workflow/werewolves_win"] <= 1.0
    assert 0.0 <= metrics["workflow/vote_hit/werewolf"] <= 1.0
    # ...but only the werewolf's timelines became samples: the multi-agent formatter sends the
    # history anew each turn (one user message), so each of its calls is one sample.
    assert metrics["context/samples"] == WEREWOLF_CALLS * ok
    records = run.records(1)
    assert len(records) == WEREWOLF_CALLS * ok
    for r in records:
        assert r["role"] == "werewolf" and len(r["segments"]) == 1
        trained = [i for i, m in enumerate(r["loss_mask"]) if m]
        assert trained and all(any(s <= i < e for s, e in r["segments"]) for i in trained)
        text = "".join(r["tokens"])
        assert ", the werewolf." in text and "# Conversation History" in text  # its own conversation
        assert ", the seer." not in text and ", the villager." not in text


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_against_the_frozen_initial_village(one_step, tmp_path: Path) -> None:
    conf = HERE / "werewolves_vs_initial.yaml"
    run = one_step(conf)
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    ok = metrics["rollout/ok"]
    # The village played on the engine's frozen initial model: recorded as context, not trained.
    assert metrics["context/calls"] == CALLS_PER_GAME * ok
    records = run.records(1)
    assert len(records) == WEREWOLF_CALLS * ok and all(r["role"] == "werewolf" for r in records)
    # The README's test evaluation: the trained werewolf against the untouched base, which
    # final_model/ holds beside adapters/werewolf/ (a per-role run).
    final = run.run_dir / "final_model"
    result = fork_ajet("eval", "--conf", str(conf), "--split", "test", "--model", str(final), "--role", "werewolf",
                       "--exp-dir", str(tmp_path / "eval"), "--name", "test", "rollout.max_tokens=16", timeout=300,
                       cwd=HERE.parent.parent, env={"WEREWOLVES_OPPONENT_CHECKPOINT": str(final)})
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"engine serves the checkpoint {final} (frozen)" in result.stderr
    report = json.loads(next((tmp_path / "eval").rglob("eval_test.json")).read_text())
    assert report["metrics"]["episodes"] == len((HERE / "test.jsonl").read_text().splitlines())


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_self_play_one_adapter_per_role(one_step) -> None:
    """One step of the 4-player self-play config: both teams trained, each game role on its own
    LoRA adapter, each rewarded with its team's win."""
    run = one_step(HERE / "werewolves_selfplay.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    ok = metrics["rollout/ok"]
    # A reward per role: the roles of one team share it, the two teams' add up to 1.
    assert metrics["role/werewolf/reward"] + metrics["role/villager/reward"] == pytest.approx(1.0)
    assert metrics["role/seer/reward"] == pytest.approx(metrics["role/villager/reward"])
    assert metrics["workflow/werewolves_win"] == pytest.approx(metrics["role/werewolf/reward"])
    # Every call is trained, in its own role's conversation.
    assert metrics["context/calls"] == CALLS_PER_GAME * ok
    records = run.records(1)
    assert len(records) == CALLS_PER_GAME * ok
    assert {r["role"] for r in records} == {"werewolf", "seer", "villager"}
    for r in records:
        assert f", the {r['role']}." in "".join(r["tokens"]) and any(r["loss_mask"])
    # One adapter per trained role in the final model.
    adapters = run.run_dir / "final_model" / "adapters"
    assert sorted(p.name for p in adapters.iterdir()) == ["seer", "villager", "werewolf"]


class _OpponentServer:
    """A fixed 'frozen opponent': an OpenAI-compatible endpoint that always answers the same: a
    sentence, or under a `response_format` JSON schema (a choice) the first value it admits."""

    @staticmethod
    def answer(body: dict) -> str:
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
        if not schema:
            return "I trust everyone here."
        return json.dumps({key: values[0] for key, values in admitted(schema).items()})

    def __init__(self) -> None:
        import uvicorn
        from fastapi import FastAPI

        self.requests = 0
        app = FastAPI()

        @app.post("/v1/chat/completions")
        def complete(body: dict) -> dict:
            self.requests += 1
            return {
                "id": f"c{self.requests}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "opponent"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": self.answer(body)}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6},
            }

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> _OpponentServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the opponent server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture
def opponent() -> Iterator[_OpponentServer]:
    with _OpponentServer() as server:
        yield server


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_an_external_opponent(one_step, opponent: _OpponentServer) -> None:
    run = one_step(HERE / "werewolves.yaml", env={"WEREWOLVES_OPPONENT_BASE_URL": opponent.url})
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    ok = metrics["rollout/ok"]
    # The village (seer's night call, 2 speeches, 2 votes) played on the opponent server and
    # was not recorded at all; only the werewolf's calls went through the tuner.
    assert opponent.requests == (CALLS_PER_GAME - WEREWOLF_CALLS) * metrics["rollout/episodes"]
    assert metrics["context/calls"] == WEREWOLF_CALLS * ok
    records = run.records(1)
    assert len(records) == WEREWOLF_CALLS * ok and all(r["role"] == "werewolf" for r in records)


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_nine_players(one_step) -> None:
    run = one_step(HERE / "werewolves9.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    assert 1 <= metrics["workflow/days"] <= 5
    # Night 1: 3 werewolves, the seer and the witch; day 1: at least 7 speeches and 7 votes.
    assert metrics["context/calls"] >= 19 * metrics["rollout/ok"]
    assert "workflow/save/witch" in metrics and "workflow/check_hit/seer" in metrics
    records = run.records(1)
    assert records and all(r["role"] == "werewolf" for r in records)
    assert all("The werewolves are " in "".join(r["tokens"]) for r in records)  # they know each other


# -- the warm-up's demonstrations (make_demos.py) ---------------------------------------------
def test_demos_are_the_scripted_werewolfs_kills_and_votes(example_modules) -> None:  # noqa: ANN001
    """demos.jsonl is what make_demos.py makes: for each seating (train first, then its own,
    never a val or test one) the werewolf's kill of the last player of its list and its vote
    for the first, as the structured-output tool call its real calls get."""
    example_modules(HERE, "make_data", "make_demos", "game", "werewolves")
    import make_demos

    key = lambda players: tuple(players.items())  # noqa: E731
    held_out = {key(json.loads(line)["players"]) for split in ("val", "test")
                for line in (HERE / f"{split}.jsonl").read_text().splitlines()}
    tasks = make_demos.demo_tasks(128)
    assert len({key(t["players"]) for t in tasks}) == 128 and not {key(t["players"]) for t in tasks} & held_out
    assert [t["task_id"] for t in tasks[:64]] == [f"train-{i}" for i in range(64)]

    shipped = [json.loads(line) for line in (HERE / "demos.jsonl").read_text().splitlines()]
    assert len(shipped) == 256
    rng = random.Random(0)
    made = [row for task in tasks[:3] for row in asyncio.run(make_demos.demo(task, rng))]
    assert made == shipped[:6]  # deterministic, and the shipped file is current
    for task, (kill, vote) in zip(tasks, zip(shipped[::2], shipped[1::2], strict=True), strict=True):
        wolf = next(name for name, role in task["players"].items() if role == "werewolf")
        assert kill["id"].endswith(f"{task['task_id']}-kill") and vote["id"].endswith(f"{task['task_id']}-vote")
        for row, question, pick in ((kill, make_demos.KILL, -1), (vote, make_demos.VOTE, 0)):
            system, history = row["messages"][0]["content"][0]["text"], row["messages"][1]["content"][0]["text"]
            assert system.endswith(f"You are {wolf}, the werewolf.") and question in history.splitlines()[-2]
            (tool,) = row["tools"]
            enum = tool["function"]["parameters"]["properties"]["name"]["enum"]
            (call,) = row["messages"][-1]["tool_calls"]
            assert json.loads(call["function"]["arguments"]) == {"name": enum[pick]} and wolf not in enum
        # the kill's list is the village in seating order
        assert kill["tools"][0]["function"]["parameters"]["properties"]["name"]["enum"] == \
            [n for n in task["players"] if n != wolf]


def test_the_rule_is_the_best_werewolf_against_a_village_voting_by_position(example_modules) -> None:  # noqa: ANN001
    """The README's ceiling: against a village that votes the first of its list 4 times in 5,
    killing the last of the list and voting the first is the best choice from every seat (0.74
    over the four seats), and the base model's habits (kill the first 4 times in 5, vote the
    first 7 times in 10) win 0.60."""
    example_modules(HERE, "make_data", "make_demos", "game", "werewolves")
    from make_demos import win_chance

    rule, best, habits = [], [], []
    for seat in range(4):
        targets = [s for s in range(4) if s != seat]
        rule.append(win_chance(seat, targets[-1], vote_first=1.0))
        best.append(max(win_chance(seat, k, v) for k in targets for v in (0.0, 1.0)))
        habits.append(0.8 * win_chance(seat, targets[0], 0.7) + sum(0.1 * win_chance(seat, k, 0.7) for k in targets[1:]))
    assert rule == pytest.approx(best)
    assert [round(x, 2) for x in best] == [0.31, 0.83, 0.91, 0.91]
    assert sum(best) / 4 == pytest.approx(0.737, abs=1e-3) and sum(habits) / 4 == pytest.approx(0.598, abs=1e-3)
    # a village voting at random: nothing to exploit, the README's "about 2 games in 3"
    assert {round(win_chance(s, k, 0.5, p_first=0.5), 3) for s in range(4) for k in range(4) if k != s} == {0.667}
