"""A stand-in for vLLM's OpenAI server, on ajet's LocalEngine (tiny model, CPU).

It answers the one request shape ajet's `OpenAICompletionsEngine` sends to Trinity's rollout
model (`POST /v1/completions`, `prompt` = token ids, `return_token_ids`, `logprobs=1`) the way
vLLM does, plus `GET /health`. It lets the Trinity workflow plugin run for real on a machine
without a GPU: everything from Trinity's `Task` to Trinity's `Experience` is the real code;
only the server behind the endpoint is ours.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from fastapi import FastAPI, Request

from ajet.engine.base import SamplingParams


class VllmStub:
    def __init__(self, engine: Any, tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.requests: list[dict[str, Any]] = []
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def _app(self) -> Any:
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.post("/v1/completions")
        async def completions(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.requests.append(body)
            params = SamplingParams(
                temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                top_k=max(0, int(body.get("top_k", -1))), max_tokens=int(body["max_tokens"]),
                stop=list(body.get("stop") or []), seed=body.get("seed"),
            )
            [done] = await self.engine.generate(list(body["prompt"]), params)
            return {"id": "cmpl-stub", "object": "text_completion", "model": body["model"], "choices": [{
                "index": 0, "text": done.text, "token_ids": done.token_ids,
                "logprobs": {"token_logprobs": done.logprobs,
                             "tokens": [f"token_id:{t}" for t in done.token_ids]},
                "finish_reason": done.finish_reason,
            }]}

        return app

    def start(self) -> VllmStub:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(self._app(), log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the vLLM stub did not start within 30 s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(10)


class FakeModelWrapper:
    """The part of Trinity's `ModelWrapper` the workflow plugin uses, with the same shapes.

    The real class cannot be imported without vllm (its module imports vllm at the top), and
    vllm needs a CUDA build of torch; `test_trinity_real.test_model_wrapper_has_what_the_plugin_uses`
    checks these members against the installed trinity source instead.
    """

    def __init__(self, api_address: str, model_path: str, *, api_key: str = "EMPTY", version: int = 0) -> None:
        self.api_address = api_address
        self._model_path = model_path
        self._api_key = api_key
        self.version = version

    def get_openai_async_client(self) -> Any:
        import openai

        client = openai.AsyncOpenAI(base_url=f"{self.api_address}/v1", api_key=self._api_key)
        client.model_path = self._model_path  # Trinity sets this attribute on its client too
        return client

    @property
    def api_key(self) -> str:
        return self._api_key

    @property
    async def model_version_async(self) -> int:  # an async property, as in Trinity
        return self.version

    @property
    def model_path(self) -> str:
        return self._model_path
