"""`llm`: an LLM grades the answer against a rubric, on an OpenAI-compatible endpoint.

The judge model is asked for `{"score": <0-10>, "reason": "..."}`; the score is also read
from "Score: 7", "7/10" or a bare number. reward = score / max_score (in [0, 1]);
success = score >= success_threshold (on the 0..max_score scale, default 7).

The endpoint: `params.base_url` (+ `api_key`, else $OPENAI_API_KEY, and `model`), or, without
a base_url, the client from `llm_client_factory()` that the backbone provides (the local
model behind the gateway). The client is created at the first call, when the backbone's
gateway is up. A reply with no score raises (the episode fails and is counted) unless
`on_parse_error: zero`, which scores it 0 and logs `judge/llm_parse_error`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from typing import Any

from ajet.judge.base import JudgeError, answer_text, run_sync
from ajet.workflow import WorkflowOutput, WorkflowTask

logger = logging.getLogger(__name__)

LOCAL_MODEL = "ajet-policy"  # the gateway's model name for the local model
DEFAULT_RUBRIC = "Is the response correct, complete and directly responsive to the question?"
SYSTEM = (
    "You are a strict grader. Grade the response to the task with the rubric. Reply with one "
    'JSON object and nothing else: {{"score": <integer 0-{max_score}>, "reason": "<one sentence>"}}\n'
    "Rubric: {rubric}"
)
_SCORE_PATTERNS = (
    re.compile(r"score(?:\s+(?:is|of))?[\s:=*\"']{0,5}(-?\d+(?:\.\d+)?)", re.IGNORECASE),
    re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*10\b"),
    re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*\.?\s*$"),
)


def parse_score(text: str, max_score: float = 10.0) -> float | None:
    """The grader's score clamped to [0, max_score], or None when the reply has none."""
    for blob in re.findall(r"\{[^{}]*\}", text):
        try:
            obj = json.loads(blob)
        except json.JSONDecodeError:
            continue
        score = obj.get("score") if isinstance(obj, dict) else None
        if isinstance(score, str):
            try:
                score = float(score)
            except ValueError:
                score = None
        if isinstance(score, (int, float)) and not isinstance(score, bool):
            return min(max(float(score), 0.0), max_score)
    for pattern in _SCORE_PATTERNS:
        match = pattern.search(text)
        if match:
            return min(max(float(match.group(1)), 0.0), max_score)
    return None


class LLMJudge:
    def __init__(
        self,
        rubric: str = DEFAULT_RUBRIC,
        base_url: str = "",
        api_key: str = "",
        model: str = "",
        success_threshold: float = 7.0,
        max_score: float = 10.0,
        temperature: float = 0.0,
        max_tokens: int = 256,
        on_parse_error: str = "fail",
        *,
        llm_client_factory: Callable[[], Any] | None = None,
        client: Any = None,
    ) -> None:
        if on_parse_error not in ("fail", "zero"):
            raise JudgeError(f"judge.params.on_parse_error must be 'fail' or 'zero', got {on_parse_error!r}")
        if client is None and not base_url and llm_client_factory is None:
            raise JudgeError(
                "judge.type=llm needs judge.params.base_url (an OpenAI-compatible endpoint, with "
                "model and api_key) or a backbone that serves the local model"
            )
        if base_url and not model:
            raise JudgeError(f"judge.params.model is required with judge.params.base_url={base_url}")
        self.rubric, self.base_url, self.api_key = rubric, base_url, api_key
        self.model = model or LOCAL_MODEL
        self.success_threshold, self.max_score = success_threshold, max_score
        self.temperature, self.max_tokens = temperature, max_tokens
        self.on_parse_error = on_parse_error
        self._factory = llm_client_factory
        self._client = client

    def messages(self, task: WorkflowTask, output: WorkflowOutput) -> list[dict[str, str]]:
        parts = [f"Task:\n{task.main_query or json.dumps(task.init_messages)[:2000]}"]
        if "answer" in task.metadata:
            parts.append(f"Reference answer:\n{task.metadata['answer']}")
        parts.append(f"Response:\n{answer_text(output)}")
        system = SYSTEM.format(max_score=int(self.max_score), rubric=self.rubric)
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    async def acompute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        reply = await self._complete(self.messages(task, output))
        score = parse_score(reply, self.max_score)
        if score is None:
            if self.on_parse_error == "fail":
                raise JudgeError(
                    f"the LLM judge's reply has no score: {reply[:200]!r}; use a stronger judge "
                    "model, or judge.params.on_parse_error=zero to score such replies 0"
                )
            logger.warning("LLM judge reply has no score (scored 0): %.200r", reply)
            output.log_metrics["judge/llm_parse_error"] = 1.0
            return 0.0, False
        output.log_metrics["judge/llm_score"] = score
        return score / self.max_score, score >= self.success_threshold

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        return run_sync(self.acompute_reward(task, output), type(self).__name__)

    async def _complete(self, messages: list[dict[str, str]]) -> str:
        client = self._get_client()
        try:
            response = await client.chat.completions.create(
                model=self.model, messages=messages,
                temperature=self.temperature, max_tokens=self.max_tokens,
            )
        except Exception as exc:  # the SDK's errors vary by client; re-raised with the endpoint
            where = self.base_url or "the local model"
            raise JudgeError(f"LLM judge call to {where} (model {self.model}) failed: {exc}") from exc
        return response.choices[0].message.content or ""

    def _get_client(self) -> Any:
        if self._client is None:
            if self.base_url:
                import openai

                key = self.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
                self._client = openai.AsyncOpenAI(base_url=self.base_url, api_key=key)
            else:
                assert self._factory is not None
                self._client = self._factory()
        return self._client
