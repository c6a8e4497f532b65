"""Retries with backoff (ajet/retry.py) for the teacher and env-service endpoints: "not now"
answers and requests that never arrived are sent again within a bounded wait; a timed-out env
step is not (it may have been applied); a teacher that stays down ends with an error naming it."""

from __future__ import annotations

import time

import httpx
import pytest

from ajet.errors import EnvServiceError
from ajet.retry import send_with_retries
from ajet.task_reader.env_client import EnvServiceClient


def flaky(answers: list) -> tuple[httpx.MockTransport, list[str]]:
    """A transport giving `answers` in turn (a status code, or an exception to raise), then 200."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        answer = answers.pop(0) if answers else 200
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, json={"ok": True, "instance_id": "i", "task_ids": ["a"]})

    return httpx.MockTransport(handler), calls


def test_not_now_answers_and_lost_connections_are_sent_again() -> None:
    transport, calls = flaky([503, httpx.ConnectError("refused"), 429])
    with httpx.Client(transport=transport, base_url="http://env") as client:
        reply = send_with_retries(lambda: client.get("/health"), what="env", idempotent=False)
    assert reply.status_code == 200 and len(calls) == 4


def test_a_timed_out_request_is_sent_again_only_if_idempotent() -> None:
    for idempotent, want_calls in ((True, 2), (False, 1)):
        transport, calls = flaky([httpx.ReadTimeout("slow")])
        with httpx.Client(transport=transport, base_url="http://env") as client:
            if idempotent:
                assert send_with_retries(lambda c=client: c.post("/score"), what="t", idempotent=True).status_code == 200
            else:
                with pytest.raises(httpx.ReadTimeout):
                    send_with_retries(lambda c=client: c.post("/step"), what="env", idempotent=False)
        assert len(calls) == want_calls


def test_the_wait_is_bounded_then_the_last_answer_is_the_callers() -> None:
    transport, calls = flaky([503] * 100)
    start = time.monotonic()
    with httpx.Client(transport=transport, base_url="http://env") as client:
        reply = send_with_retries(lambda: client.get("/health"), what="env", idempotent=True, max_wait_s=1.0)
    assert reply.status_code == 503 and 2 <= len(calls) <= 4 and time.monotonic() - start < 5


def test_the_env_client_retries_a_restarting_server_but_never_repeats_a_step(monkeypatch) -> None:
    client = EnvServiceClient("http://env")
    transport, calls = flaky([502, 503])
    client._http = httpx.Client(transport=transport, base_url="http://env")
    assert client.list_tasks("math") == ["a"] and calls == ["/list_tasks"] * 3
    transport, calls = flaky([httpx.ReadTimeout("slow")])
    client._http = httpx.Client(transport=transport, base_url="http://env")
    with pytest.raises(EnvServiceError, match="cannot reach the env service at http://env/step"):
        client.step("i", "go north")
    assert calls == ["/step"]  # it may have been applied: not sent twice


def test_a_teacher_that_stays_down_ends_the_step_with_an_error_naming_it(monkeypatch) -> None:
    import ajet.retry as retry
    from ajet.training.teacher import EndpointTeacher, TeacherUnavailable
    from tests.unit.test_distill import FakeChatTokenizer, merged_sample, vllm_like
    from tests.unit.tiny_models import tiny_llama

    teacher = EndpointTeacher("http://teacher:8000/v1", FakeChatTokenizer(), transport=vllm_like(tiny_llama()))
    down, calls = flaky([httpx.ConnectError("refused")] * 100)
    teacher.client = httpx.Client(transport=down)
    monkeypatch.setattr(retry.tenacity, "stop_after_delay", lambda _: retry.tenacity.stop_after_attempt(3))
    with pytest.raises(TeacherUnavailable, match="distill.teacher http://teacher:8000/v1 did not answer"):
        teacher.score([merged_sample()])
    assert len(calls) == 3
