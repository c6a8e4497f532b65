"""The episode API over real HTTP: `EpisodeBroker` behind a `Gateway`, driven by `EpisodeClient`.

The engine, chat format and tracker are the fakes of test_tuner_fakes (one character per
token), so the tests check the broker's bookkeeping, not a model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from test_tuner_fakes import FakeChat, FakeEngine, FakeTracker

from ajet.config.schema import ClientReward, ContextConfig, DynamicSamplingConfig, RolloutConfig
from ajet.serve.broker import EpisodeBroker
from ajet.serve.client import EpisodeAPIError, EpisodeClient
from ajet.serve.http import attach_episode_api
from ajet.tuner import EpisodeSession, Gateway, ModelTuner
from ajet.workflow import WorkflowTask

TOKEN = "test-client-token"


class Tracker(FakeTracker):
    def timelines(self) -> list[Any]:
        return [c.completion_ids for c in self.calls]

    def stats(self) -> dict[str, float]:
        return {"calls": float(len(self.calls))}


@dataclass
class Handle:
    tuner: Any
    tracker: Tracker
    session: EpisodeSession

    def close(self) -> None:
        self.tuner.close()


class Sessions:
    def __init__(self, gateway: Gateway, engine: FakeEngine) -> None:
        self.gateway, self.engine, self.chat = gateway, engine, engine.chat

    def open_episode(self, episode_id: str, task: WorkflowTask) -> Handle:
        tracker = Tracker(self.chat)
        session = EpisodeSession(episode_id, self.engine, self.chat, tracker, RolloutConfig(max_tokens=50),
                                 ContextConfig(), None, 4096)
        return Handle(ModelTuner(session, gateway=self.gateway), tracker, session)


class Reader:
    curriculum = None

    def __init__(self) -> None:
        self.read = 0
        self.steps: list[int] = []  # the step of each draw (a curriculum draws by step)
        self.last_draws: list[int] = []
        self.trained: dict[int, int] = {}  # draw -> the step that trained it

    def track_trained(self) -> None:
        pass

    def mark_trained(self, draws: list[int], step: int) -> None:
        self.trained.update(dict.fromkeys(draws, step))

    def next_batch(self, size: int, *, step: int = 1) -> list[WorkflowTask]:
        self.last_draws = list(range(self.read, self.read + size))
        self.read += size
        self.steps.append(step)
        return [WorkflowTask(task_id=f"t{self.read}", main_query=f"q{self.read}",
                             metadata={"answer": "ok", "topic": "greetings"})]


class Judge:
    def compute_reward(self, task: WorkflowTask, output: Any) -> tuple[float, bool]:
        right = output.metadata.get("final_answer") == task.metadata["answer"]
        return (1.0 if right else 0.0), right


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    gateway: Gateway
    broker: EpisodeBroker
    engine: FakeEngine
    clock: Clock
    client: EpisodeClient

    @property
    def root(self) -> str:
        return self.gateway.base_url.removesuffix("/v1")


@pytest.fixture()
def make_server() -> Iterator[Any]:
    started: list[Server] = []

    def make(*, n: int = 2, batch_size: int = 1, total_steps: int = 3, max_staleness: int = 0,
             timeout_s: float = 60.0, public_metadata_keys: tuple[str, ...] = (),
             dynamic_rounds: int = 0, judge: Any = ..., client_reward: ClientReward = ClientReward.accept) -> Server:
        gateway = Gateway().start()
        engine = FakeEngine(FakeChat(), lambda prompt: "ok", policy_version=0)
        clock = Clock()
        broker = EpisodeBroker(Reader(), Judge() if judge is ... else judge, Sessions(gateway, engine),
                               RolloutConfig(n=n, episode_timeout_s=timeout_s, dynamic_sampling=DynamicSamplingConfig(
                                   enabled=dynamic_rounds > 0, max_rounds=max(dynamic_rounds, 1))),
                               batch_size=batch_size,
                               total_steps=total_steps, policy_version=lambda: engine.policy_version,
                               max_staleness=max_staleness, clock=clock,
                               public_metadata_keys=public_metadata_keys, client_reward=client_reward)
        attach_episode_api(gateway, broker, TOKEN)
        server = Server(gateway, broker, engine, clock, EpisodeClient(gateway.base_url, TOKEN, wait_s=0))
        started.append(server)
        return server

    yield make
    for server in started:
        server.client.close()
        server.broker.close()
        server.gateway.stop()


def chat(episode: Any, content: str = "hi") -> httpx.Response:
    return httpx.post(f"{episode.base_url}/chat/completions", timeout=10,
                      headers={"Authorization": f"Bearer {episode.api_key}"},
                      json={"model": episode.model, "messages": [{"role": "user", "content": content}]})


def test_client_token_guards_the_api_and_docs_describe_it(make_server: Any) -> None:
    server = make_server()
    assert httpx.post(f"{server.root}/v1/episodes").status_code == 401
    with pytest.raises(EpisodeAPIError) as err, EpisodeClient(server.root, "wrong") as wrong:
        wrong.status()
    assert err.value.status == 401 and err.value.code == "invalid_client_token"
    episode = server.client.begin()
    # An episode's model key is not a client token, and the client token is not a model key.
    with pytest.raises(EpisodeAPIError), EpisodeClient(server.root, episode.api_key) as as_client:
        as_client.status()
    assert httpx.post(f"{server.root}/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"},
                      json={"model": "m", "messages": []}).status_code == 401
    # The docs follow the API's auth (issue 53): before, anyone could read them.
    assert httpx.get(f"{server.root}/openapi.json").status_code == 401
    assert httpx.get(f"{server.root}/docs").status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    schema = httpx.get(f"{server.root}/openapi.json", headers=auth).json()
    assert {"/v1/episodes", "/v1/episodes/{episode_id}/finish", "/v1/episodes/{episode_id}/abort",
            "/v1/status"} <= set(schema["paths"])
    assert "swagger" in httpx.get(f"{server.root}/docs", headers=auth).text.lower()


def test_only_the_client_that_began_an_episode_can_end_it(make_server: Any) -> None:
    """Before (issue 53), anyone with the shared client token could finish or abort any episode,
    and episode ids are guessable: now finish and abort need the episode's own api_key."""
    server = make_server(n=2, batch_size=1)
    mine, theirs = server.client.begin(), server.client.begin()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for headers in ({}, {"X-Episode-Key": mine.api_key}, {"X-Episode-Key": theirs.api_key + "x"}):
        for action, body in (("finish", {"reward": 1.0}), ("abort", {"reason": "not mine"})):
            refused = httpx.post(f"{server.root}/v1/episodes/{theirs.episode_id}/{action}", json=body,
                                 headers={**auth, **headers})
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "wrong_episode_key"
            assert "X-Episode-Key" in refused.json()["error"]["message"]
    assert server.broker.status is not None and chat(theirs).status_code == 200  # still running, unharmed
    done = httpx.post(f"{server.root}/v1/episodes/{theirs.episode_id}/finish", json={"reward": 0.5},
                      headers={**auth, "X-Episode-Key": theirs.api_key})
    assert done.status_code == 200 and done.json()["reward"] == 0.5
    assert server.client.finish(mine.episode_id, 1.0)["status"] == "ok"  # the client sends its own key


def test_each_task_is_handed_out_n_times_and_finished_keys_die(make_server: Any) -> None:
    server = make_server(n=2, batch_size=1)
    first, second = server.client.begin(), server.client.begin()
    assert first.task == second.task and first.task["task_id"] == "t1"
    assert first.episode_id != second.episode_id and first.api_key != second.api_key
    reply = chat(first)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "ok"
    done = server.client.finish(first.episode_id, 0.5, log_metrics={"turns": 1.0})
    assert done["status"] == "ok" and done["reward"] == 0.5
    assert chat(first).status_code == 401  # a finished episode's key is dead
    with pytest.raises(EpisodeAPIError) as err:
        server.client.finish(first.episode_id, 1.0)
    assert err.value.status == 409
    with pytest.raises(EpisodeAPIError) as err:
        server.client.finish("nope", 1.0)
    assert err.value.status == 404
    bad = httpx.post(f"{server.root}/v1/episodes/{second.episode_id}/finish", json={"reward": "high", "score": 1},
                     headers={"Authorization": f"Bearer {TOKEN}"})
    assert bad.status_code == 422 and "reward" in bad.json()["error"]["message"]
    # No reward: the judge scores the metadata, as for WorkflowOutput(reward=None).
    judged = server.client.finish(second.episode_id, metadata={"final_answer": "ok"})
    assert judged["reward"] == 1.0 and judged["is_success"] is True

    result = asyncio.run(server.broker.next_batch(1))
    assert [e.episode_id for e in result.ok_episodes] == [first.episode_id, second.episode_id]
    assert {e.group_id for e in result.episodes} == {result.episodes[0].group_id}
    assert result.ok_episodes[0].timelines and result.ok_episodes[0].num_calls == 1
    assert result.ok_episodes[0].policy_versions == [0]
    assert result.metrics()["workflow/turns"] == 1.0


def test_aborted_and_vanished_episodes_are_counted_never_trained(make_server: Any) -> None:
    server = make_server(n=3, batch_size=1, timeout_s=30)
    kept, aborted, vanished = (server.client.begin() for _ in range(3))
    chat(aborted)
    chat(vanished)
    server.client.finish(kept.episode_id, 1.0)
    assert server.client.abort(aborted.episode_id, "tool sandbox died")["status"] == "failed"
    assert chat(aborted).status_code == 401
    server.clock.now += 31  # the third client never comes back
    status = server.client.status()
    assert (status["episodes_timed_out"], status["episodes_aborted"], status["episodes_running"]) == (1, 1, 0)
    assert chat(vanished).status_code == 401
    with pytest.raises(EpisodeAPIError) as err:
        server.client.finish(vanished.episode_id, 1.0)
    assert err.value.status == 409 and "timeout" in str(err.value)

    result = asyncio.run(server.broker.next_batch(1))
    metrics = result.metrics()
    assert [e.episode_id for e in result.ok_episodes] == [kept.episode_id]
    assert metrics["rollout/failed/aborted"] == 1 and metrics["rollout/timeouts"] == 1
    assert all(not e.timelines for e in result.episodes if e.status != "ok")
    assert "tool sandbox died" in next(e for e in result.episodes if e.reason == "aborted").error_message


def test_on_policy_clients_wait_for_the_update_then_the_run_ends(make_server: Any) -> None:
    server = make_server(n=1, batch_size=2, total_steps=2, max_staleness=0)
    episodes = [server.client.begin() for _ in range(2)]
    with pytest.raises(EpisodeAPIError) as err:  # step 1's groups are out; step 2 waits for step 1
        server.client.begin()
    assert err.value.status == 503 and err.value.code == "no_episode_available"
    for episode in episodes:
        chat(episode)
        server.client.finish(episode.episode_id, 1.0)
    assert len(asyncio.run(server.broker.next_batch(1)).ok_episodes) == 2
    server.engine.bump_version()  # the trainer's update

    async def step_two() -> Any:
        waiting = asyncio.ensure_future(server.broker.next_batch(2))
        await asyncio.sleep(0.05)  # next_batch(2) opens step 2's groups

        def client_side() -> list[str]:
            ids = []
            for _ in range(2):
                episode = server.client.begin()
                chat(episode)
                server.client.finish(episode.episode_id, 0.0)
                ids.append(episode.episode_id)
            return ids

        ids = await asyncio.to_thread(client_side)
        return ids, await asyncio.wait_for(waiting, 10)

    ids, result = asyncio.run(step_two())
    assert [e.episode_id for e in result.ok_episodes] == ids
    assert all(e.policy_versions == [1] for e in result.ok_episodes)
    assert server.client.begin() is None  # 410: every group of the run is handed out


def test_episodes_older_than_max_staleness_are_dropped_and_counted(make_server: Any) -> None:
    server = make_server(n=1, batch_size=1, total_steps=5, max_staleness=1)
    a, b = server.client.begin(), server.client.begin()  # step 1 and, one ahead, step 2
    with pytest.raises(EpisodeAPIError):
        server.client.begin()
    chat(a)
    chat(b)
    server.engine.policy_version = 2  # two updates happened meanwhile
    server.client.finish(b.episode_id, 1.0)
    result = asyncio.run(server.broker.next_batch(1))
    assert result.ok_episodes == [] and result.metrics()["rollout/failed/stale"] == 1
    assert server.client.status()["episodes_dropped_stale"] == 1
    server.client.finish(a.episode_id, 1.0)
    server.engine.policy_version = 1
    kept = asyncio.run(server.broker.next_batch(2))
    assert [e.episode_id for e in kept.ok_episodes] == [a.episode_id]
    assert kept.metrics()["rollout/stale_kept"] == 1


def test_tickets_keep_the_judges_answer_on_the_server(make_server: Any) -> None:
    """Before (issue 53) only the judge's keys were removed: every other column of the data (a
    "solution", an "expression") reached the client. Now the ticket is an allow-list."""
    server = make_server(n=1, batch_size=1)
    episode = server.client.begin()
    assert episode.task == {"task_id": "t1", "main_query": "q1", "init_messages": [], "env_type": "",
                            "metadata": {}}  # no "answer" (the judge's reference), no "topic"
    # The judge still scores against the full task, answer included.
    judged = server.client.finish(episode.episode_id, metadata={"final_answer": "ok"})
    assert judged["reward"] == 1.0 and judged["is_success"] is True
    result = asyncio.run(server.broker.next_batch(1))
    assert result.ok_episodes[0].task.metadata == {"answer": "ok", "topic": "greetings"}


def test_serve_public_metadata_keys_names_what_clients_see(make_server: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    episode = make_server(n=1, public_metadata_keys=("topic",)).client.begin()
    assert episode.task["metadata"] == {"topic": "greetings"}
    assert "serve.public_metadata_keys shows clients" not in caplog.text
    server = make_server(n=1, public_metadata_keys=("answer", "topic"))  # a judge's key: warned
    assert "shows clients ['answer'], which the judge compares with" in caplog.text
    episode = server.client.begin()
    assert episode.task["metadata"] == {"answer": "ok", "topic": "greetings"}
    assert server.client.finish(episode.episode_id, metadata={"final_answer": "ok"})["reward"] == 1.0


def test_each_group_draws_its_task_at_the_step_it_is_for(make_server: Any) -> None:
    """A curriculum ramps by step: the groups opened ahead (max_staleness) draw at their own step."""
    server = make_server(n=1, batch_size=2, total_steps=3, max_staleness=1)
    server.broker.reader.curriculum = SimpleNamespace(pool_fraction=lambda step: step / 10)
    episodes = [server.client.begin() for _ in range(4)]  # steps 1 and 2 (one ahead)
    assert server.broker.reader.steps == [1, 1, 2, 2]
    for episode in episodes[:2]:
        server.client.finish(episode.episode_id, 1.0)
    assert asyncio.run(server.broker.next_batch(1)).metrics()["data/curriculum_pool"] == 0.1


def test_dynamic_sampling_replaces_a_group_without_signal_up_to_max_rounds(make_server: Any) -> None:
    server = make_server(n=2, batch_size=1, total_steps=2, max_staleness=1, dynamic_rounds=2)
    flat = [server.client.begin() for _ in range(2)]
    for episode in flat:  # equal rewards: no signal
        chat(episode)
        server.client.finish(episode.episode_id, 1.0)
    refill = [server.client.begin() for _ in range(2)]  # handed out at once, for the same step
    assert {e.task["task_id"] for e in refill} == {"t2"} and server.broker.reader.steps == [1, 1]
    server.engine.policy_version = 2  # the replaced group is now 2 versions old: never trained, never "stale"
    for episode, reward in zip(refill, (1.0, 0.0), strict=True):
        chat(episode)
        server.client.finish(episode.episode_id, reward)
    result = asyncio.run(server.broker.next_batch(1))
    metrics = result.metrics()
    assert [e.episode_id for e in result.ok_episodes] == [e.episode_id for e in refill]
    assert metrics.get("rollout/failed/stale", 0) == 0
    assert len(result.episodes) == 4 and result.dropped_groups == [flat[0].episode_id.rsplit("-e", 1)[0]]
    assert (metrics["dynamic/rounds"], metrics["dynamic/tasks"], metrics["dynamic/kept_groups"],
            metrics["dynamic/dropped_groups"]) == (2, 2, 1, 1)
    assert metrics["rollout/dropped_groups"] == 1

    # Step 2: two groups without signal in a row; the second is the last round, so the step takes it.
    server.engine.bump_version()
    for _ in range(2):
        for episode in [server.client.begin() for _ in range(2)]:
            server.client.finish(episode.episode_id, 0.0)
    last = asyncio.run(server.broker.next_batch(2))
    assert len(last.episodes) == 4 and len(last.ok_episodes) == 2
    assert last.metrics()["dynamic/kept_groups"] == 0 and last.metrics()["dynamic/rounds"] == 2
    assert server.client.begin() is None  # refills never add groups to the run


def test_a_step_takes_the_oldest_steps_groups_first(make_server: Any) -> None:
    """A refill completes after the next step's group: the step still trains its own groups."""
    server = make_server(n=2, batch_size=1, total_steps=2, max_staleness=1, dynamic_rounds=2)
    first = [server.client.begin() for _ in range(2)]  # step 1
    ahead = [server.client.begin() for _ in range(2)]  # step 2, one ahead
    for episode, reward in zip(ahead, (1.0, 0.0), strict=True):
        server.client.finish(episode.episode_id, reward)
    for episode in first:  # no signal: a refill of step 1 takes its place
        server.client.finish(episode.episode_id, 0.0)
    refill = [server.client.begin() for _ in range(2)]
    for episode, reward in zip(refill, (1.0, 0.0), strict=True):
        server.client.finish(episode.episode_id, reward)
    step_one = asyncio.run(server.broker.next_batch(1))
    assert [e.episode_id for e in step_one.ok_episodes] == [e.episode_id for e in refill]
    step_two = asyncio.run(server.broker.next_batch(2))
    assert [e.episode_id for e in step_two.ok_episodes] == [e.episode_id for e in ahead]


def test_clients_wait_while_a_running_group_may_still_be_replaced(make_server: Any) -> None:
    """The run's last group is handed out, but dynamic sampling may replace it: a client asking
    meanwhile gets 503 (retry), not 410 (it would leave, and the refill would never run)."""
    server = make_server(n=2, batch_size=1, total_steps=1, dynamic_rounds=2)
    last = [server.client.begin() for _ in range(2)]
    with pytest.raises(EpisodeAPIError) as err:
        server.client.begin()
    assert err.value.status == 503 and err.value.code == "no_episode_available"
    for episode in last:
        server.client.finish(episode.episode_id, 0.0)
    refill = [server.client.begin() for _ in range(2)]
    for episode in refill:
        server.client.finish(episode.episode_id, 0.0)
    assert server.client.begin() is None  # the chain is at max_rounds: nothing can replace it, 410


def test_a_finish_that_failed_on_the_way_can_be_sent_again_with_the_episodes_key() -> None:
    """The client keeps an episode's key until the episode has ended: a retried finish after a
    503 (or a dropped connection) still shows it."""
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/episodes":
            return httpx.Response(200, json={"episode_id": "t1-e0", "task": {}, "base_url": "http://x/v1",
                                             "api_key": "k-123", "model": "policy"})
        seen.append(request.headers.get("x-episode-key", ""))
        if len(seen) == 1:
            return httpx.Response(503, json={"error": {"message": "busy", "type": "server_error", "code": None}})
        return httpx.Response(200, json={"episode_id": "t1-e0", "status": "ok", "reward": 1.0})

    client = EpisodeClient("http://server", TOKEN)
    client._http = httpx.Client(base_url="http://server", transport=httpx.MockTransport(answer))
    episode = client.begin()
    with pytest.raises(EpisodeAPIError):
        client.finish(episode.episode_id, 1.0)
    assert client.finish(episode.episode_id, 1.0)["status"] == "ok"
    assert seen == ["k-123", "k-123"] and client._keys == {}


# ------------------------------------------------------------------ what a client is trusted with (issue 69 §4)
def finish_raw(server: Server, episode: Any, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.root}/v1/episodes/{episode.episode_id}/finish", json=body, timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}", "X-Episode-Key": episode.api_key})


def test_a_clients_reward_is_refused_where_the_judge_scores(make_server: Any) -> None:
    """Before: with a judge configured, a client's `reward` was trained on as it was (a client
    could give itself 1.0); now serve.client_reward=auto refuses it, with what to do instead."""
    server = make_server(n=2, client_reward=ClientReward.auto)
    episode = server.client.begin()
    refused = finish_raw(server, episode, {"reward": 1.0})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "client_reward_refused"
    assert "finish without `reward`" in refused.json()["error"]["message"]
    assert finish_raw(server, episode, {"reward": {"default": 1.0}}).status_code == 400  # per-role too
    # The episode is still open: finished without a reward, the judge scores it.
    judged = finish_raw(server, episode, {"metadata": {"final_answer": "wrong"}})
    assert judged.status_code == 200 and judged.json()["reward"] == 0.0
    # refuse refuses, accept accepts, auto accepts where there is no judge
    assert finish_raw(server := make_server(client_reward=ClientReward.refuse), server.client.begin(),
                      {"reward": 1.0}).status_code == 400
    for kwargs in ({"client_reward": ClientReward.accept}, {"client_reward": ClientReward.auto, "judge": None}):
        server = make_server(**kwargs)
        done = finish_raw(server, server.client.begin(), {"reward": 1.0})
        assert done.status_code == 200 and done.json()["reward"] == 1.0


def test_client_metrics_cannot_pass_for_the_judges_or_the_sandboxs(make_server: Any) -> None:
    """Before: a client's log_metrics {"judge/accuracy": 1.0} was logged as the judge's own
    judge/accuracy (mean_log_metrics keeps judge/ and sandbox/ names); now it is refused."""
    server = make_server(n=1)
    episode = server.client.begin()
    for key in ("judge/accuracy", "sandbox/timeouts"):
        refused = finish_raw(server, episode, {"reward": 1.0, "log_metrics": {key: 1.0, "turns": 2.0}})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "reserved_metric_name"
        assert key in refused.json()["error"]["message"] and "workflow/<key>" in refused.json()["error"]["message"]
    assert finish_raw(server, episode, {"reward": 1.0, "log_metrics": {"turns": 2.0}}).status_code == 200
    from ajet.rollout.manager import mean_log_metrics

    result = asyncio.run(server.broker.next_batch(1))
    assert mean_log_metrics(result.ok_episodes, set())["workflow/turns"] == 2.0


class FailingJudge:
    def compute_reward(self, task: WorkflowTask, output: Any) -> float:
        raise ValueError(f"reference answer {task.metadata['answer']!r} vs {output.metadata}\nsecond line")


def test_a_judges_traceback_stays_in_the_server_log(make_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Before: a failing judge's whole traceback (the server's code, paths, the task's answer in
    the message) was sent to the remote client as `detail`."""
    server = make_server(n=1, judge=FailingJudge())
    with caplog.at_level("WARNING", logger="ajet.serve.broker"):
        result = server.client.finish(server.client.begin().episode_id, metadata={"final_answer": "x"})
    assert result["status"] == "failed" and result["reason"] == "judge_error:ValueError"
    assert result["detail"] == "the judge failed (judge_error:ValueError); the details are in the server's log"
    assert "Traceback" in caplog.text and "reference answer 'ok'" in caplog.text  # the server keeps it all



def test_a_served_episodes_refused_calls_are_counted_by_field(make_server: Any) -> None:
    """A call the gateway refuses (400 naming the field) counts in the step's gateway/refused/<field>
    under `ajet serve` too, as in-process (ajet.rollout.scoring.collect_refusals)."""
    server = make_server(n=1, batch_size=1)
    episode = server.client.begin()
    refused = httpx.post(f"{episode.base_url}/chat/completions", timeout=10,
                         headers={"Authorization": f"Bearer {episode.api_key}"},
                         json={"model": episode.model, "messages": [{"role": "user", "content": "hi"}], "n": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
    assert chat(episode).status_code == 200
    server.client.finish(episode.episode_id, 1.0)
    result = asyncio.run(server.broker.next_batch(1))
    assert result.episodes[0].refused == {"n": 1}
    assert result.metrics()["gateway/refused/n"] == 1
