"""`llm` judge with a fake OpenAI-compatible client: prompt, score parsing, thresholds, errors."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from ajet.config.schema import JudgeConfig
from ajet.judge import JudgeError, build_judge
from ajet.judge.llm_judge import LLMJudge, parse_score
from ajet.workflow import WorkflowOutput, WorkflowTask


class FakeOpenAI:
    """Just enough of `openai.AsyncOpenAI`: `await client.chat.completions.create(...)`."""

    def __init__(self, reply: str | Exception) -> None:
        self.reply = reply
        self.calls: list[dict] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **kwargs):
        self.calls.append(kwargs)
        if isinstance(self.reply, Exception):
            raise self.reply
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.reply))])


TASK = WorkflowTask(task_id="t", main_query="Capital of France?", metadata={"answer": "Paris"})


def run(judge: LLMJudge, text: str = "Paris is the capital.") -> tuple[WorkflowOutput, tuple[float, bool]]:
    output = WorkflowOutput(metadata={"final_answer": text})
    return output, asyncio.run(judge.acompute_reward(TASK, output))


@pytest.mark.parametrize("reply,score", [
    ('{"score": 8, "reason": "good"}', 8.0),
    ('Sure! ```json\n{"score": "6.5", "reason": "ok"}\n```', 6.5),
    ("Score: 9\nReason: fine", 9.0),
    ("The score is 4 because...", 4.0),
    ("I rate it 7/10.", 7.0),
    ("3", 3.0),
    ('{"score": 15}', 10.0),  # clamped
    ("score: -2", 0.0),
    ("**Score**: 6", 6.0),
    ("no number at all", None),
    ("There are 3 problems.", None),  # a stray number is not a score
])
def test_parse_score(reply: str, score: float | None) -> None:
    assert parse_score(reply) == score


def test_prompt_reward_and_success_threshold() -> None:
    client = FakeOpenAI('{"score": 8, "reason": "correct"}')
    judge = LLMJudge(rubric="Is it the right city?", client=client, model="judge-m")
    output, (reward, success) = run(judge)
    assert reward == pytest.approx(0.8) and success is True
    assert output.log_metrics["judge/llm_score"] == 8.0
    [call] = client.calls
    assert call["model"] == "judge-m" and call["temperature"] == 0.0
    system, user = call["messages"][0]["content"], call["messages"][1]["content"]
    assert "Is it the right city?" in system and '"score"' in system
    assert "Capital of France?" in user and "Paris" in user and "Paris is the capital." in user

    strict = LLMJudge(client=FakeOpenAI('{"score": 8}'), success_threshold=9)
    assert run(strict)[1] == (pytest.approx(0.8), False)


def test_factory_client_is_created_lazily_and_uses_local_model() -> None:
    made: list[FakeOpenAI] = []

    def factory() -> FakeOpenAI:
        made.append(FakeOpenAI("Score: 10"))
        return made[-1]

    judge = build_judge(JudgeConfig(type="llm", params={"rubric": "r"}), llm_client_factory=factory)
    assert made == []  # the backbone's gateway may not be up yet at build time
    assert run(judge)[1] == (1.0, True)
    run(judge)
    assert len(made) == 1 and made[0].calls[0]["model"] == "ajet-policy"


def test_unparsable_reply_fails_or_scores_zero() -> None:
    with pytest.raises(JudgeError, match="has no score.*on_parse_error=zero"):
        run(LLMJudge(client=FakeOpenAI("I refuse.")))
    output, verdict = run(LLMJudge(client=FakeOpenAI("I refuse."), on_parse_error="zero"))
    assert verdict == (0.0, False) and output.log_metrics["judge/llm_parse_error"] == 1.0


def test_client_error_names_endpoint() -> None:
    judge = LLMJudge(client=FakeOpenAI(ConnectionError("refused")), base_url="http://x:1/v1", model="m")
    with pytest.raises(JudgeError, match=r"call to http://x:1/v1 \(model m\) failed: refused"):
        run(judge)


def test_config_errors() -> None:
    with pytest.raises(JudgeError, match="needs judge.params.base_url"):
        build_judge(JudgeConfig(type="llm"))
    with pytest.raises(JudgeError, match="model is required"):
        build_judge(JudgeConfig(type="llm", params={"base_url": "http://h/v1"}))


def test_sync_compute_reward() -> None:
    judge = LLMJudge(client=FakeOpenAI('{"score": 5}'))
    task_out = WorkflowOutput(metadata={"answer": "x"})
    assert judge.compute_reward(TASK, task_out) == (0.5, False)

    async def inside_loop() -> None:
        judge.compute_reward(TASK, task_out)

    with pytest.raises(JudgeError, match="await judge.acompute_reward"):
        asyncio.run(inside_loop())


def test_real_openai_client_against_fake_server() -> None:
    """The default client path (openai.AsyncOpenAI on base_url) speaks the wire protocol."""
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        return httpx.Response(200, json={
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": '{"score": 7}'}}],
        })

    import openai

    client = openai.AsyncOpenAI(base_url="http://judge.local/v1", api_key="k",
                                http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    judge = LLMJudge(client=client, base_url="http://judge.local/v1", model="m")
    assert run(judge)[1] == (pytest.approx(0.7), True)
