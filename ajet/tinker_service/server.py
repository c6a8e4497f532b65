"""`TinkerServer`: `ajet tinker`'s process: the model, the engine, the trainer and the HTTP
server, started in order and closed in reverse.

`start()` serves on a background thread (tests, benchmarks); `run()` serves in the foreground
until Ctrl-C / SIGTERM (the CLI). Either way, when the server is told to stop, every pending
future fails at once ("ajet tinker stopped ..."), so a client blocked on `result()` gets an
error instead of waiting on a server that is gone.

What a client needs to connect (base URL, API key) is written to `STATE/tinker.json`, readable
by its owner only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ajet.errors import UserError
from ajet.files import write_json_atomic
from ajet.http_server import ServerLimits, uvicorn_config, uvicorn_server
from ajet.tinker_service.checkpoints import CheckpointStore
from ajet.tinker_service.routes import app
from ajet.tinker_service.service import ServiceSettings, TinkerService
from ajet.tinker_service.trainer import LoraTrainer

log = logging.getLogger(__name__)

KEY_ENV = "AJET_TINKER_API_KEY"


@dataclass
class ServerOptions:
    model: str  # a local checkpoint directory or the bundled model's name
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = ""  # the base_model clients use; "" = the checkpoint's absolute path
    lora_alpha: int = 32
    max_samplers: int = 8
    max_body_mb: int = 64
    max_batch_size: int = 32
    prefix_cache_tokens: int = 8192


def api_key_from_env() -> tuple[str, bool]:
    """(the key, whether it was generated): $AJET_TINKER_API_KEY, else a new random one. The SDK
    accepts only keys that start with 'tml-'."""
    key = os.environ.get(KEY_ENV, "")
    if key and not key.startswith("tml-"):
        raise UserError(f"${KEY_ENV} must start with 'tml-' (the Tinker SDK refuses other keys)")
    return (key, False) if key else (f"tml-{secrets.token_urlsafe(24)}", True)


class TinkerServer:
    def __init__(self, options: ServerOptions, api_key: str) -> None:
        self.options, self.api_key = options, api_key
        self.service: TinkerService | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._engine: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{self.options.host}:{self.options.port}"

    def setup(self) -> TinkerServer:
        """Load the model, wrap it for LoRA clients, start the engine; bind the port."""
        from transformers import AutoModelForCausalLM, AutoTokenizer  # torch: not for `ajet --help`

        from ajet.engine.local import LocalEngine
        from ajet.models.resolve import resolve_model_path

        path = resolve_model_path(self.options.model, key="--model").resolve()
        tokenizer = AutoTokenizer.from_pretrained(path)
        base = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
        trainer = LoraTrainer(base)
        self._engine = LocalEngine(trainer.model, tokenizer, max_batch_size=self.options.max_batch_size,
                                   prefix_cache_tokens=self.options.prefix_cache_tokens)
        name = self.options.model_name or str(path)
        settings = ServiceSettings(base_model=name, aliases=frozenset({self.options.model, str(path)}),
                                   tokenizer_id=str(path), lora_alpha=self.options.lora_alpha,
                                   max_samplers=self.options.max_samplers, max_context=self._engine.max_model_len)
        self.service = TinkerService(self._engine, trainer, CheckpointStore(self.options.state_dir), settings)
        self._bind()
        return self

    def _bind(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.options.host, self.options.port))
        except OSError as err:
            sock.close()
            raise UserError(f"cannot listen on {self.options.host}:{self.options.port}: {err} (--port)") from err
        self.options.port = sock.getsockname()[1]
        self._socket = sock
        assert self.service is not None
        asgi = app(self.service, self.api_key, self.options.max_body_mb << 20)
        limits = ServerLimits(body_timeout_s=120.0)
        config = uvicorn_config(asgi, limits, lifespan="off", loop="asyncio")
        self._server = uvicorn_server(config, limits)
        write_json_atomic(self.options.state_dir / "tinker.json", {"base_url": self.base_url, "api_key": self.api_key,
                                                                   "base_model": self.service.settings.base_model},
                          permissions=0o600)

    async def _serve(self) -> None:
        """uvicorn, and a watcher that fails pending futures as soon as a stop is asked."""
        assert self.service is not None
        service = self.service

        async def watch() -> None:
            while not self._server.should_exit:
                await asyncio.sleep(0.1)
            await service.close()

        watcher = asyncio.ensure_future(watch())
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            watcher.cancel()
            await service.close()

    def run(self) -> None:
        """Serve in the foreground until Ctrl-C or SIGTERM."""
        try:
            asyncio.run(self._serve())
        finally:
            self.close()

    def start(self, timeout_s: float = 60.0) -> TinkerServer:
        """Serve on a background thread; returns once it accepts connections."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="ajet-tinker", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ajet tinker did not start on {self.base_url} within {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.close()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> TinkerServer:
        return self.setup().start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
