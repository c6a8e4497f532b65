"""ajet's `InferenceEngine` over an OpenAI-compatible vLLM server, token ids in and out.

Trinity's rollout model serves vLLM's OpenAI API (`explorer.rollout_model.enable_openai_api`).
Chat completions would re-render the whole history with the server's template; ajet's
tracker builds the prompt ids itself (token-in, token-out), so this engine uses the plain
completions endpoint with `prompt` = token ids and asks vLLM for the sampled token ids
(`return_token_ids`, vLLM >= 0.10.2) and their logprobs, with `return_tokens_as_token_ids`
as the fallback for older servers. The request/response handling is pure and unit-tested;
only `generate` does I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ajet.backbones.gpu_worker import vllm_sampling
from ajet.engine.base import Completion, EngineFeatures, SamplingParams
from ajet.errors import InfrastructureError

log = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"


def completion_request(prompt_ids: list[int], params: SamplingParams, *, model: str) -> dict[str, Any]:
    """The JSON body of `POST /v1/completions` for one sampled completion (pure)."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "n": 1,
        "logprobs": 1,
        **vllm_sampling(params),  # top_k among them: a vLLM extension
        # vLLM extensions
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }


def parse_choice(choice: dict[str, Any], *, policy_version: int) -> Completion:
    """One `choices[i]` of a vLLM completions response -> Completion (pure).

    Token ids come from `token_ids` when present, else from the `token_id:N` strings that
    `return_tokens_as_token_ids` puts in `logprobs.tokens`.
    """
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs")
    token_ids = choice.get("token_ids")
    if token_ids is None:
        tokens = logprobs.get("tokens")
        if tokens is None:
            raise InfrastructureError(
                "the completions server returned neither token_ids nor logprobs.tokens; it must be "
                "vLLM's OpenAI server (return_token_ids / return_tokens_as_token_ids)"
            )
        token_ids = [_token_id(t) for t in tokens]
    if values is None or len(values) != len(token_ids):
        raise InfrastructureError(
            f"the completions server returned {len(token_ids)} tokens but "
            f"{'no' if values is None else len(values)} logprobs; request logprobs=1"
        )
    finish = choice.get("finish_reason") or "stop"
    return Completion(
        token_ids=[int(t) for t in token_ids],
        logprobs=[float(v) if v is not None else 0.0 for v in values],
        finish_reason="length" if finish == "length" else "stop",
        policy_version=policy_version,
        text=choice.get("text") or "",
    )


def _token_id(token: str) -> int:
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        raise InfrastructureError(
            f"logprobs.tokens entry {token!r} is not 'token_id:N'; the server ignored "
            "return_tokens_as_token_ids (is it vLLM?)"
        )
    return int(token[len(TOKEN_ID_PREFIX):])


class OpenAICompletionsEngine(EngineFeatures):
    """`InferenceEngine` on `{base_url}/completions` (vLLM). Weights are synced by the backbone;
    `version_fn` (async) reports the server's current policy version."""

    def __init__(self, base_url: str, *, model: str, api_key: str = "EMPTY",
                 version_fn: Callable[[], Awaitable[int]] | None = None, timeout_s: float = 600.0) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.policy_version = 0
        self._version_fn = version_fn
        self._client = httpx.AsyncClient(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"})

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        import httpx

        if params.n != 1:
            raise ValueError(f"n={params.n}: the completions engine samples one completion per call")
        if self._version_fn is not None:
            self.policy_version = int(await self._version_fn())
        body = completion_request(prompt_ids, params, model=self.model)
        try:
            response = await self._client.post(f"{self.base_url}/completions", json=body)
        except httpx.TransportError as exc:
            raise InfrastructureError(f"completions server {self.base_url}: {exc}") from exc
        if response.status_code >= 500:
            raise InfrastructureError(f"completions server answered {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            raise ValueError(f"completions server rejected the request ({response.status_code}): "
                             f"{response.text[:300]}")
        return [parse_choice(c, policy_version=self.policy_version) for c in response.json()["choices"]]

    def bump_version(self) -> int:
        return self.policy_version

    def load_state_dict(self, state_dict: dict) -> int:
        raise NotImplementedError("weights of a remote vLLM server are synced by the backbone")

    async def aclose(self) -> None:
        await self._client.aclose()
