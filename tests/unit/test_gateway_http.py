"""Gateway over real HTTP (uvicorn on a thread): keys, errors, isolation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from test_tuner_fakes import make_session

from ajet.tuner import Gateway

BODY = {"model": "ajet-policy", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    gw = Gateway(max_body_bytes=64 * 1024).start()
    yield gw
    gw.stop()


def post(gateway: Gateway, body: object = BODY, key: str | None = None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(kw.pop("headers", {}))
    content = (
        body if isinstance(body, (bytes, str)) or hasattr(body, "__next__") else json.dumps(body)
    )
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=content,
        headers={"Content-Type": "application/json", **headers},
        timeout=30,
        **kw,
    )


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def test_binds_localhost_and_lists_models(gateway: Gateway) -> None:
    assert gateway.base_url.startswith("http://127.0.0.1:") and gateway.base_url.endswith("/v1")
    session, *_ = make_session([])
    key = gateway.register(session, "default")
    models = httpx.get(
        f"{gateway.base_url}/models", headers={"Authorization": f"Bearer {key}"}
    ).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "ajet-policy"
    assert_openai_error(httpx.get(f"{gateway.base_url}/models"), 401, "invalid_api_key")
    gateway.unregister_session(session)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer not-a-key"},
    ],
)
def test_missing_or_unknown_key_is_401_and_reaches_no_session(
    gateway: Gateway, headers: dict
) -> None:
    session, engine, tracker, _ = make_session(["never"])
    gateway.register(session, "default")
    assert_openai_error(post(gateway, headers=headers), 401, "invalid_api_key")
    assert tracker.built == [] and engine.seen == []


def test_keys_die_after_unregister_and_with_their_episode(gateway: Gateway) -> None:
    session, _, tracker, _ = make_session(["one", "two"])
    key = gateway.register(session, "default")
    assert post(gateway, key=key).status_code == 200
    gateway.unregister_session(session)
    assert_openai_error(post(gateway, key=key), 401)

    key2 = gateway.register(session, "default")
    session.close()
    assert_openai_error(post(gateway, key=key2), 401)
    assert gateway.unregister_session(session) == 1
    assert len(tracker.calls) == 1


def test_keys_are_unguessable(gateway: Gateway) -> None:
    session, *_ = make_session([])
    keys = {gateway.register(session, "default") for _ in range(50)}
    assert len(keys) == 50 and all(len(k) >= 40 for k in keys)
    assert gateway.unregister_session(session) == 50


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        ({"model": "x"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "role"),
        ({**BODY, "temperature": 5}, "temperature"),
        ({**BODY, "max_tokens": 0}, "max_tokens"),
        ({**BODY, "n": 2}, "n=2"),
        ({**BODY, "stop": [""]}, "stop"),
    ],
)
def test_bad_requests_are_400_with_openai_bodies(
    gateway: Gateway, body: object, fragment: str
) -> None:
    session, engine, _, _ = make_session(["never"])
    key = gateway.register(session, "default")
    error = assert_openai_error(post(gateway, body, key), 400)
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    assert engine.seen == []
    gateway.unregister_session(session)


def test_oversized_body_is_413(gateway: Gateway) -> None:
    session, engine, _, _ = make_session(["never"])
    key = gateway.register(session, "default")
    big = {"messages": [{"role": "user", "content": "x" * (70 * 1024)}]}
    assert_openai_error(post(gateway, big, key), 413, "request_too_large")

    def chunked():  # no Content-Length: the limit holds while streaming the body
        data = json.dumps(big).encode()
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    assert_openai_error(post(gateway, chunked(), key), 413)
    assert engine.seen == []


def test_prompt_over_budget_is_400_context_length_exceeded(gateway: Gateway) -> None:
    session, engine, _, _ = make_session(["never"], model_max_len=8)
    key = gateway.register(session, "default")
    assert_openai_error(post(gateway, key=key), 400, "context_length_exceeded")
    assert engine.seen == []


def test_engine_failure_is_500(gateway: Gateway) -> None:
    session, engine, tracker, _ = make_session(["x"])
    engine.fail_with = RuntimeError("engine thread died")
    key = gateway.register(session, "default")
    error = assert_openai_error(post(gateway, key=key), 500)
    assert "engine thread died" in error["message"] and error["type"] == "server_error"
    assert tracker.calls == []


def test_unknown_route_is_an_openai_error(gateway: Gateway) -> None:
    assert_openai_error(httpx.get(f"{gateway.base_url}/nothing"), 404)


def test_concurrent_episodes_never_see_each_others_calls(gateway: Gateway) -> None:
    def echo(prompt: str) -> str:  # the reply names the episode whose prompt it saw
        return "reply to " + prompt.split("episode ")[-1].split("<")[0]

    sessions = [make_session(echo, episode_id=f"ep{i}", delay_s=0.02) for i in range(3)]
    keys = [gateway.register(s[0], "default") for s in sessions]

    async def one(client: httpx.AsyncClient, i: int, turn: int) -> str:
        body = {"messages": [{"role": "user", "content": f"episode {i}-{turn}"}], "temperature": 0}
        r = await client.post(
            f"{gateway.base_url}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {keys[i]}"},
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    async def main() -> list[str]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, i, t) for t in range(4) for i in range(3)))

    replies = asyncio.run(main())
    assert replies == [f"reply to {i}-{t}" for t in range(4) for i in range(3)]
    for i, (session, _, tracker, _) in enumerate(sessions):
        assert len(tracker.calls) == 4
        assert {c.messages[0]["content"] for c in tracker.calls} == {
            f"episode {i}-{t}" for t in range(4)
        }
        gateway.unregister_session(session)


def test_start_stop_restart_frees_the_port() -> None:
    gw = Gateway().start()
    url = gw.base_url
    gw.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/models", timeout=2)
    with pytest.raises(RuntimeError, match="not running"):
        _ = gw.base_url


def test_listening_socket_disables_nagle(gateway: Gateway) -> None:
    # Without TCP_NODELAY on accepted sockets each small reply waited ~40 ms (delayed ACK).
    import socket

    sock = gateway._socket
    assert sock is not None and sock.proto == socket.IPPROTO_TCP
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_calls_past_max_calls_per_episode_are_429_naming_the_setting(gateway: Gateway) -> None:
    from ajet.config.schema import RolloutConfig

    session, engine, _, _ = make_session(lambda prompt: "ok", rollout=RolloutConfig(max_calls_per_episode=2))
    key = gateway.register(session, "default")
    assert [post(gateway, key=key).status_code for _ in range(2)] == [200, 200]
    error = assert_openai_error(post(gateway, key=key), 429, "too_many_calls")
    assert "rollout.max_calls_per_episode=2" in error["message"] and len(engine.seen) == 2
    assert gateway.running  # the process stays up


def test_a_full_engine_queue_is_429_engine_busy(gateway: Gateway) -> None:
    from ajet.engine.requests import EngineBusyError

    session, engine, _, _ = make_session(["never"])

    async def busy(*args: object, **kwargs: object) -> None:
        raise EngineBusyError("9 requests are waiting for the engine (rollout.max_waiting_requests=9); retry later")

    engine.generate = busy
    key = gateway.register(session, "default")
    error = assert_openai_error(post(gateway, key=key), 429, "engine_busy")
    assert "rollout.max_waiting_requests=9" in error["message"]


# ---------------------------------------------------------------- every field honoured or refused (issue 58 §2)

@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("verbosity", "low"),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("functions", [{"name": "f"}]),
        ("reasoning_effort", "high"),
    ],
)
def test_a_field_ajet_cannot_honour_is_a_400_naming_it(gateway: Gateway, field: str, value: object) -> None:
    session, engine, _, _ = make_session(["never"])
    key = gateway.register(session, "default")
    error = assert_openai_error(post(gateway, {**BODY, field: value}, key), 400, "unsupported_parameter")
    assert error["param"] == field and field in error["message"] and "docs/gateway.md" in error["message"]
    assert engine.seen == []
    gateway.unregister_session(session)


def test_parallel_tool_calls_false_is_refused_by_an_engine_without_grammars(gateway: Gateway) -> None:
    """Only a grammar stops a second call (issue 71); an engine without one says so by name, and
    the refusal is counted by the field (the fake engine, like vLLM's here, has no grammar)."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    session, engine, _, _ = make_session(["a"])
    key = gateway.register(session, "default")
    body = {**BODY, "tools": tools, "parallel_tool_calls": False}
    error = assert_openai_error(post(gateway, body, key), 400, "unsupported_parameter")
    assert error["param"] == "parallel_tool_calls" and "constrains decoding" in error["message"]
    assert engine.seen == [] and session.stats()["gateway/refused/parallel_tool_calls"] == 1
    assert post(gateway, {**BODY, "parallel_tool_calls": False}, key).status_code == 200  # no tools: nothing to stop
    gateway.unregister_session(session)


@pytest.mark.parametrize(("field", "value"), [("frequency_penalty", 0.5), ("presence_penalty", -1),
                                              ("logit_bias", {"42": 5})])
def test_penalties_reach_the_engine_or_are_refused_by_one_that_cannot_apply_them(
        gateway: Gateway, field: str, value: object) -> None:
    session, engine, _, _ = make_session(["a", "b"])
    key = gateway.register(session, "default")
    error = assert_openai_error(post(gateway, {**BODY, field: value}, key), 400)
    assert error["type"] == "invalid_request_error" and field in error["message"] and "does not apply penalties" in error["message"] and engine.seen == []
    engine.supports_penalties = True  # as the debug backbone's LocalEngine
    assert post(gateway, {**BODY, field: value}, key).status_code == 200
    expected = {"logit_bias": {42: 5.0}} if field == "logit_bias" else {field: float(value)}
    assert {k: getattr(engine.seen[0][1], k) for k in expected} == expected
    assert post(gateway, {**BODY, "logit_bias": {"99999999": 1}}, key).status_code == 400  # not in the vocab
    gateway.unregister_session(session)


def test_fields_with_no_effect_and_the_honoured_values_are_served(gateway: Gateway,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    session, engine, _, _ = make_session(["a", "b", "c"])
    key = gateway.register(session, "default")
    body = {**BODY, "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "top_logprobs": 0,
            "parallel_tool_calls": True, "user": "u1", "metadata": {"k": "v"}, "store": False}
    assert post(gateway, body, key).status_code == 200
    # a field outside the protocol (a framework's own) is accepted, and logged once
    with caplog.at_level("WARNING", logger="ajet.tuner.gateway"):
        assert post(gateway, {**BODY, "my_framework_hint": 1}, key).status_code == 200
        assert post(gateway, {**BODY, "my_framework_hint": 2}, key).status_code == 200
    notes = [r.getMessage() for r in caplog.records if "my_framework_hint" in r.getMessage()]
    assert len(notes) == 1 and "not part of the chat-completions protocol" in notes[0]
    gateway.unregister_session(session)


def test_top_logprobs_need_logprobs_and_an_engine_that_returns_them(gateway: Gateway) -> None:
    session, engine, _, _ = make_session(["a", "b"])
    key = gateway.register(session, "default")
    error = assert_openai_error(post(gateway, {**BODY, "top_logprobs": 2}, key), 400, "invalid_value")
    assert error["param"] == "top_logprobs" and "logprobs=true" in error["message"]
    assert_openai_error(post(gateway, {**BODY, "logprobs": True, "top_logprobs": 21}, key), 400)
    error = assert_openai_error(post(gateway, {**BODY, "logprobs": True, "top_logprobs": 2}, key), 400)
    assert error["message"].startswith("top_logprobs: this backbone's engine returns only")  # as vLLM's engines here
    assert engine.seen == []
    engine.supports_top_logprobs = True  # as the debug backbone's LocalEngine
    assert post(gateway, {**BODY, "logprobs": True, "top_logprobs": 2}, key).status_code == 200
    assert engine.seen[0][1].top_logprobs == 2
    gateway.unregister_session(session)


def test_logprobs_are_the_recorded_ones(gateway: Gateway) -> None:
    session, _, tracker, _ = make_session(["hi!"])
    key = gateway.register(session, "default")
    reply = post(gateway, {**BODY, "logprobs": True}, key).json()
    content = reply["choices"][0]["logprobs"]["content"]
    call = tracker.calls[-1]
    assert [c["logprob"] for c in content] == call.completion_logprobs  # exactly what is trained on
    assert "".join(c["token"] for c in content).startswith("hi!")
    assert all(c["top_logprobs"] == [] and bytes(c["bytes"]).decode() == c["token"] for c in content)
    error = assert_openai_error(post(gateway, {**BODY, "logprobs": True, "stream": True}, key), 400)
    assert error["param"] == "logprobs"
    gateway.unregister_session(session)


def test_a_forced_call_cut_at_max_tokens_is_a_tool_call_with_finish_length(gateway: Gateway) -> None:
    """Before, the client got ajet's markup as content: '<tool_call>\\n{"name": "add", "arguments": {"'."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    written = 'add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    session, _, tracker, _ = make_session([written, written])
    key = gateway.register(session, "default")
    body = {**BODY, "tools": tools, "tool_choice": "required"}
    # cut after '"b"': the arguments so far do not parse, closed or not
    choice = post(gateway, {**body, "max_tokens": len('add", "arguments": {"a": 1, "b"')}, key).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    message = choice["message"]
    assert message["content"] is None and "<tool_call>" not in json.dumps(message)
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": '{"a": 1, "b"'}
    assert tracker.calls[-1].finish_reason == "length"
    # cut after '"a": 1': closed as it parses, and still said to be cut
    choice = post(gateway, {**body, "max_tokens": len('add", "arguments": {"a": 1')}, key).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    gateway.unregister_session(session)
