"""Werewolves trains for one step on the debug backbone with only the werewolf's tokens trained,
both with the other roles on the policy (recorded as context) and on an external opponent
model; and the game's rules hold."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CALLS_PER_GAME = 8  # night: werewolf + seer; day: 3 survivors speak, then 3 vote
WEREWOLF_CALLS = 3  # night kill, speech, vote (the werewolf always survives the night)


@pytest.fixture
def game_module(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(HERE))
    import game

    return game


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
    # ...but only the werewolf's timelines became samples: one per game, its three calls merged.
    assert metrics["context/samples"] == ok
    records = run.records(1)
    assert len(records) == ok
    for r in records:
        assert r["role"] == "werewolf"
        assert len(r["segments"]) == WEREWOLF_CALLS
        trained = [i for i, m in enumerate(r["loss_mask"]) if m]
        assert trained and all(any(s <= i < e for s, e in r["segments"]) for i in trained)
        text = "".join(r["tokens"])
        assert ", the werewolf." in text  # the werewolf's own conversation
        assert ", the seer." not in text and ", the villager." not in text


class _OpponentServer:
    """A fixed 'frozen opponent': an OpenAI-compatible endpoint that always answers the same."""

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
                             "message": {"role": "assistant", "content": "I trust everyone here."}}],
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
    assert len(records) == ok and all(r["role"] == "werewolf" for r in records)


def test_rules(game_module) -> None:
    g = game_module
    game = g.Game({"Ann": "villager", "Bo": "werewolf", "Cy": "seer", "Di": "villager"})
    assert game.player("werewolf") == "Bo" and game.others("Bo") == ["Ann", "Cy", "Di"]
    assert g.parse_choice("I think cy, not Ann", ["Ann", "Cy"]) == "Cy"
    assert g.parse_choice("Annie did it", ["Ann", "Cy"]) is None  # whole words only
    rng = random.Random(0)
    assert g.choose(game, "Di!", ["Ann", "Di"], rng) == "Di" and game.invalid_choices == 0
    assert g.choose(game, "nobody", ["Ann", "Di"], rng) in ("Ann", "Di") and game.invalid_choices == 1
    assert g.tally({"Ann": "Bo", "Cy": "Bo", "Di": "Ann"}, rng) == "Bo"
    assert {g.tally({"Ann": "Bo", "Bo": "Ann"}, random.Random(s)) for s in range(20)} == {"Ann", "Bo"}
    game.eliminate("Cy")
    assert game.winner() == "werewolves"
    game.eliminate("Bo")
    assert game.winner() == "village"
    with pytest.raises(ValueError, match="exactly one werewolf"):
        g.Game({"Ann": "villager", "Bo": "seer"})


def test_trained_team(game_module) -> None:
    trained_team = game_module.trained_team
    assert trained_team(lambda role: role == "werewolf") == "werewolves"
    assert trained_team(lambda role: role in ("seer", "villager")) == "village"
    with pytest.raises(ValueError, match="one team"):
        trained_team(lambda role: True)  # empty trainable_targets = every role
