"""`TinkerService`: what each route of `ajet tinker` does (the routes, `ajet.tinker_service.routes`,
only parse and answer).

It owns the local engine (sampling) and the `LoraTrainer` (one adapter per training client) on
one model, the checkpoint store, the sessions and the futures. Training work runs one request at
a time, in the order requests arrive, on one worker thread, with the engine paused: the SDK
sends a training client's requests in its own order (`seq_id`), so arrival order is that order.
Sampling runs on the engine's thread (continuous batching) and waits only while a training
request holds the engine.

Samplers: `save_weights_and_get_sampling_client()` (a sampler checkpoint without a name) makes a
frozen copy of the adapter (kind "snapshot") or samples the live adapter (kind "inflight"); a
sampler of a saved path loads that checkpoint as a frozen adapter. At most `max_samplers` frozen
copies are kept; the least recently used one is dropped, and its sampler answers 404.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from ajet.tinker_service import losses, sampler
from ajet.tinker_service.checkpoints import (
    CheckpointRef,
    CheckpointStore,
    RunRecord,
    check_name,
    expiry,
    parse_path,
)
from ajet.tinker_service.errors import BadRequestError, GoneError, NotFoundError, NotServedError
from ajet.tinker_service.futures import FutureStore
from ajet.tinker_service.trainer import LoraSpec, LoraTrainer, spec_of
from ajet.tinker_service.wire import (
    ForwardBackwardIn,
    encode_forward_backward_output,
    encode_sample_response,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Session:
    created: float
    last_heartbeat: float
    models: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=list)
    finished: bool = False
    user_metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class Sampler:
    adapter: str | None  # the engine's adapter; None: the base model
    model_path: str | None
    frozen: bool  # its adapter is its own copy (dropped with it)


@dataclass
class ServiceSettings:
    base_model: str  # the name clients give (and get back)
    aliases: frozenset[str]  # other names accepted for it
    tokenizer_id: str  # what the SDK's get_tokenizer() loads
    lora_alpha: int = 32
    max_samplers: int = 8
    max_context: int = 4096
    future_wait_s: float = 20.0


class TinkerService:
    def __init__(self, engine: Any, trainer: LoraTrainer, store: CheckpointStore, settings: ServiceSettings) -> None:
        self.engine, self.trainer, self.store, self.settings = engine, trainer, store, settings
        self.futures = FutureStore()
        self.sessions: dict[str, Session] = {}
        self.samplers: dict[str, Sampler] = {}
        self._frozen: OrderedDict[str, str] = OrderedDict()  # frozen adapter -> its sampler, LRU first
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="tinker-trainer")
        self._count = 0
        self._last_request: dict[str, str] = {}

    # ------------------------------------------------------------------ helpers
    def _id(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self.futures.boot}{self._count:03d}{secrets.token_hex(2)}"

    def _train(self, fn: Callable[[], T], *, changes_weights: bool = False) -> asyncio.Future[T]:
        """Run `fn` on the worker thread with the engine paused (FIFO: queued now, in arrival order)."""
        def run() -> T:
            with self.engine.paused():
                result = fn()
                if changes_weights:
                    self.engine.bump_version()  # empties the prefix cache: no KV of the old weights
            return result

        return asyncio.get_running_loop().run_in_executor(self._worker, run)

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"no session {session_id!r} in this run of the service")
        if session.finished:
            raise GoneError(f"session {session_id} has finished")
        return session

    def check_base_model(self, name: str | None) -> str:
        if name is not None and name != self.settings.base_model and name not in self.settings.aliases:
            raise NotServedError(f"base_model={name!r}", f"this service serves {self.settings.base_model!r}")
        return self.settings.base_model

    # ------------------------------------------------------------------ sessions
    def create_session(self, request: dict[str, Any]) -> dict[str, Any]:
        session_id = self._id("s")
        now = time.time()
        self.sessions[session_id] = Session(now, now, user_metadata=request.get("user_metadata") or {})
        return {"type": "create_session", "session_id": session_id,
                "info_message": f"ajet tinker: {self.settings.base_model} on the local engine"}

    def heartbeat(self, session_id: str) -> dict[str, Any]:
        self.session(session_id).last_heartbeat = time.time()
        return {"type": "session_heartbeat"}

    async def finish_session(self, session_id: str) -> None:
        """The client closed: its training models and samplers are unloaded (checkpoints stay)."""
        session = self.sessions.get(session_id)
        if session is None or session.finished:
            return
        session.finished = True
        names = [*session.models, *(s.adapter for sid in session.samplers
                                    if (s := self.samplers.pop(sid, None)) and s.frozen and s.adapter)]
        def drop() -> None:
            for name in names:
                self.trainer.drop(name)

        await self._train(drop, changes_weights=True)
        for name in names:
            self._frozen.pop(name, None)

    def session_info(self, session_id: str) -> dict[str, Any]:
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"no session {session_id!r} in this run of the service")
        return {"training_run_ids": session.models, "sampler_ids": session.samplers,
                "user_metadata": session.user_metadata or None}

    # ------------------------------------------------------------------ training models
    def create_model(self, request: dict[str, Any]) -> str:
        session = self.session(request["session_id"])
        base = self.check_base_model(request.get("base_model"))
        lora = request.get("lora_config")
        if lora is None:
            raise NotServedError("full fine-tuning (create_model without lora_config)")
        _check_optimizer(request.get("optimizer_config"))
        spec = LoraSpec(int(lora["rank"]), self.settings.lora_alpha, bool(lora.get("train_mlp", True)),
                        bool(lora.get("train_attn", True)), bool(lora.get("train_unembed", True)))
        # The SDK derives a model's id from (session, model_seq_id) itself when it creates one by loading
        # a checkpoint: every model id is made that way.
        model_id = f"{request['session_id']}:train:{int(request['model_seq_id'])}"
        if model_id in self.trainer.clients:
            raise BadRequestError(f"training model {model_id} exists")
        record = RunRecord(model_id, base, spec.rank, spec.alpha, spec.train_mlp, spec.train_attn, spec.train_unembed,
                           _now(), {k: str(v) for k, v in (request.get("user_metadata") or {}).items()})

        def create() -> dict[str, Any]:
            self.trainer.create(model_id, spec, lora.get("seed"))
            self.store.add_run(record)
            session.models.append(model_id)
            return {"type": "create_model", "model_id": model_id}

        return self.futures.submit(self._train(create))

    def get_info(self, model_id: str) -> dict[str, Any]:
        spec = self.trainer.client(model_id).spec
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": spec.rank,
                "model_name": self.settings.base_model,
                "model_data": {"arch": type(self.trainer.model.base_model.model).__name__,
                               "model_name": self.settings.base_model, "tokenizer_id": self.settings.tokenizer_id}}

    def forward_backward(self, request: ForwardBackwardIn) -> str:
        self.trainer.client(request.model_id)  # 404 before queueing
        losses.check(request.loss_fn, request.config, request.data)  # refused by name before any work
        longest = max(len(d.tokens) for d in request.data)
        if longest > self.settings.max_context:
            raise BadRequestError(f"a datum of {longest} tokens exceeds the model's context ({self.settings.max_context})")
        self._touch(request.model_id)

        def run() -> bytes:
            outputs, metrics = self.trainer.forward_backward(request)
            return encode_forward_backward_output(outputs, metrics)

        return self.futures.submit(self._train(run))

    def optim_step(self, request: dict[str, Any]) -> str:
        model_id = request["model_id"]
        self.trainer.client(model_id)
        params = request.get("adam_params")
        if params is None:
            raise NotServedError("optimizers other than Adam (optimizer_params)")
        adam = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
                "grad_clip_norm": 0.0, **{k: float(v) for k, v in params.items()}}
        self._touch(model_id)

        async def run() -> dict[str, Any]:
            metrics = await self._train(lambda: self.trainer.optim_step(model_id, adam), changes_weights=True)
            return {"metrics": metrics}

        return self.futures.submit(run())

    def unload(self, model_id: str) -> str:
        self.trainer.client(model_id)

        async def run() -> dict[str, Any]:
            await self._train(lambda: self.trainer.drop(model_id), changes_weights=True)
            return {"type": "unload_model", "model_id": model_id}

        return self.futures.submit(run())

    # ------------------------------------------------------------------ checkpoints
    def save_weights(self, request: dict[str, Any]) -> str:
        model_id = request["model_id"]
        self.trainer.client(model_id)
        ref = CheckpointRef(model_id, "weights", check_name(request.get("path") or f"step-{self._count}"))
        meta = {"user_metadata": request.get("user_metadata") or {}, **expiry(request.get("ttl_seconds"))}
        overwrite = bool(request.get("overwrite", False))

        def run() -> dict[str, Any]:
            self.store.write(ref, lambda d: self.trainer.save(model_id, d, optimizer=True), meta, overwrite)
            return {"type": "save_weights", "path": ref.tinker_path}

        return self.futures.submit(self._train(run))

    def save_for_sampler(self, request: dict[str, Any]) -> str:
        model_id = request["model_id"]
        self.trainer.client(model_id)
        name = request.get("path")
        if name is None:  # save_weights_and_get_sampling_client(): an ephemeral sampler
            return self.futures.submit(self._ephemeral_sampler(model_id, request.get("kind", "snapshot")))
        ref = CheckpointRef(model_id, "sampler_weights", check_name(name))
        meta = {"user_metadata": request.get("user_metadata") or {}, **expiry(request.get("ttl_seconds"))}

        def run() -> dict[str, Any]:
            self.store.write(ref, lambda d: self.trainer.save(model_id, d, optimizer=False), meta)
            return {"type": "save_weights_for_sampler", "path": ref.tinker_path}

        return self.futures.submit(self._train(run))

    async def _ephemeral_sampler(self, model_id: str, kind: str) -> dict[str, Any]:
        session = next((s for s in self.sessions.values() if model_id in s.models), None)
        sampler_id = self._id("x")
        if kind == "inflight":
            self.samplers[sampler_id] = Sampler(model_id, None, frozen=False)
        else:
            adapter = f"__{sampler_id}"
            await self._train(lambda: self.trainer.copy_adapter(model_id, adapter))
            self._keep_frozen(sampler_id, Sampler(adapter, None, frozen=True))
        if session is not None:
            session.samplers.append(sampler_id)
        return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}

    def load_weights(self, request: dict[str, Any]) -> str:
        ref = parse_path(request["path"])
        directory = self.store.existing(ref)
        optimizer = bool(request.get("optimizer"))
        if request.get("weights_access_token"):
            raise NotServedError("weights_access_token (checkpoints of other accounts)")
        model_id = request.get("model_id")
        if model_id is not None:  # load_state into an existing training client
            self.trainer.client(model_id)

            def load() -> dict[str, Any]:
                self.trainer.load(model_id, directory, optimizer)
                return {"type": "load_weights", "path": ref.tinker_path, "model_id": model_id}

            return self.futures.submit(self._train(load, changes_weights=True))
        # create_training_client_from_state(path): a new training client with the checkpoint
        _check_optimizer(request.get("optimizer_config"))
        spec = spec_of(directory)
        lora = {"rank": spec.rank, "train_mlp": spec.train_mlp, "train_attn": spec.train_attn,
                "train_unembed": spec.train_unembed}
        if request.get("session_id") is None or request.get("model_seq_id") is None:
            raise BadRequestError("load_weights: give model_id (load into a training model) or session_id and model_seq_id")
        create = {"session_id": request["session_id"], "model_seq_id": request["model_seq_id"],
                  "base_model": request.get("base_model"),
                  "lora_config": lora, "user_metadata": request.get("user_metadata")}
        created = self.create_model(create)

        async def run() -> dict[str, Any]:
            made = await self.futures.retrieve(created, wait_s=3600)
            if not isinstance(made, dict):
                raise BadRequestError(f"creating the training model failed: {made.message}")
            new_id = made["model_id"]
            await self._train(lambda: self.trainer.load(new_id, directory, optimizer), changes_weights=True)
            return {"type": "load_weights", "path": ref.tinker_path, "model_id": new_id}

        return self.futures.submit(run())

    def checkpoints(self, model_id: str | None = None) -> dict[str, Any]:
        runs = [model_id] if model_id is not None else [r.model_id for r in self.store.runs()]
        found = [c for run in runs for c in self.store.checkpoints(run)]
        return {"checkpoints": found, "cursor": None}

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        kind, _, name = checkpoint_id.partition("/")
        shutil.rmtree(self.store.existing(parse_path(f"tinker://{model_id}/{kind}/{name}")))

    def training_run(self, model_id: str) -> dict[str, Any]:
        record = self.store.run(model_id)
        checkpoints = self.store.checkpoints(model_id)
        last = {t: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == t), None)
                for t in ("training", "sampler")}
        return {"training_run_id": model_id, "base_model": record.base_model, "model_owner": "local",
                "is_lora": True, "lora_rank": record.rank, "corrupted": False,
                "last_request_time": self._last_request.get(model_id, record.created),
                "last_checkpoint": last["training"], "last_sampler_checkpoint": last["sampler"],
                "user_metadata": record.user_metadata or None}

    def weights_info(self, tinker_path: str) -> dict[str, Any]:
        ref = parse_path(tinker_path)
        self.store.existing(ref)
        record = self.store.run(ref.model_id)
        return {"base_model": record.base_model, "is_lora": True, "lora_rank": record.rank,
                "train_mlp": record.train_mlp, "train_attn": record.train_attn, "train_unembed": record.train_unembed}

    # ------------------------------------------------------------------ sampling
    async def create_sampler(self, request: dict[str, Any]) -> str:
        session = self.session(request["session_id"])
        path = request.get("model_path")
        sampler_id = self._id("x")
        if path is None:
            self.check_base_model(request.get("base_model"))
            self.samplers[sampler_id] = Sampler(None, None, frozen=False)
        else:
            directory = self.store.existing(parse_path(path))
            adapter = f"__{sampler_id}"
            await self._train(lambda: self.trainer.load_frozen(adapter, directory))
            self._keep_frozen(sampler_id, Sampler(adapter, path, frozen=True))
        session.samplers.append(sampler_id)
        return sampler_id

    def sampler_info(self, sampler_id: str) -> dict[str, Any]:
        found = self._sampler(sampler_id)
        return {"sampler_id": sampler_id, "base_model": self.settings.base_model, "model_path": found.model_path}

    def _sampler(self, sampler_id: str) -> Sampler:
        found = self.samplers.get(sampler_id)
        if found is None:
            raise NotFoundError(f"no sampler {sampler_id!r}: unknown, or dropped (at most --max-samplers "
                                f"{self.settings.max_samplers} frozen samplers are kept; the least recently used goes)")
        if found.adapter is not None and not found.frozen and found.adapter not in self.trainer.clients:
            raise NotFoundError(f"sampler {sampler_id!r}: its training model was unloaded")
        if found.frozen and found.adapter is not None:
            self._frozen.move_to_end(found.adapter)
        return found

    def _keep_frozen(self, sampler_id: str, found: Sampler) -> None:
        assert found.adapter is not None
        self.samplers[sampler_id] = found
        self._frozen[found.adapter] = sampler_id
        while len(self._frozen) > self.settings.max_samplers:
            adapter, old = self._frozen.popitem(last=False)
            self.samplers.pop(old, None)
            log.info("dropped sampler %s (more than --max-samplers %d)", old, self.settings.max_samplers)
            self._train(lambda name=adapter: self.trainer.drop(name))  # type: ignore[misc]

    def sample(self, request: dict[str, Any]) -> tuple[str, list[str]]:
        """Queue a sample; (request id, one sequence id per sample)."""
        sampler.refuse_unserved(request)
        if request.get("sampling_session_id") is not None:
            found = self._sampler(request["sampling_session_id"])
        elif request.get("model_path") is not None:
            raise NotServedError("sampling by model_path without a sampling session (create_sampling_client first)")
        else:
            self.check_base_model(request.get("base_model"))
            found = Sampler(None, None, frozen=False)
        tokens = sampler.prompt_tokens(request["prompt"])
        num = int(request.get("num_samples", 1))
        topk = int(request.get("topk_sample_logprobs", 0))
        params, cut = sampler.engine_params(request.get("sampling_params") or {}, num, topk,
                                            self.engine.eos_token_ids, self.engine.tokenizer.decode)
        if len(tokens) + params.max_tokens > self.settings.max_context:
            raise BadRequestError(f"prompt ({len(tokens)} tokens) + max_tokens ({params.max_tokens}) exceed the "
                                  f"model's context ({self.settings.max_context})")
        want_prompt = bool(request.get("prompt_logprobs"))
        last_n = request.get("prompt_logprobs_last_n")

        async def run() -> bytes:
            completions = await self.engine.generate(tokens, params, model=sampler.engine_model(found.adapter))
            prompt_lp = None
            if want_prompt:
                lp = await self._train(lambda: self.trainer.prompt_logprobs(found.adapter, tokens))
                prompt_lp = sampler.with_nan_first(lp, last_n)
            return encode_sample_response([sampler.sequence(c, cut) for c in completions], prompt_lp, topk)

        request_id = self.futures.submit(run())
        return request_id, [f"{request_id}-{i}" for i in range(num)]

    # ------------------------------------------------------------------ misc
    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [{"model_name": self.settings.base_model, "trainable": True,
                                      "sampleable": True, "max_context_length": self.settings.max_context}]}

    def training_runs(self, limit: int, offset: int) -> dict[str, Any]:
        runs = self.store.runs()
        page = [self.training_run(r.model_id) for r in runs[offset:offset + limit]]
        return {"training_runs": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}

    def _touch(self, model_id: str) -> None:
        self._last_request[model_id] = _now()

    async def close(self) -> None:
        self.futures.close("ajet tinker stopped before this request finished")
        self._worker.shutdown(wait=False, cancel_futures=True)


def _check_optimizer(config: dict[str, Any] | None) -> None:
    if config is not None and config.get("type", "adamw") != "adamw":
        raise NotServedError(f"optimizer {config.get('type')!r} (only adamw)")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()
