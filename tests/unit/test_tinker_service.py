"""`ajet tinker` driven by the real Tinker SDK (tinker 0.38): an in-process service on a free
port over the tiny model, a few tokens a request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'ajet[tinker]'")
from tinker import types  # noqa: E402

from ajet.engine.base import SamplingParams  # noqa: E402
from ajet.tinker_service.checkpoints import CheckpointRef, CheckpointStore, RunRecord, parse_path  # noqa: E402
from ajet.tinker_service.server import ServerOptions, TinkerServer  # noqa: E402
from ajet.training.adapters import adapter_parameters  # noqa: E402

KEY = "tml-test-key"
TEXT = "The quick brown fox jumps over the lazy dog."


def start(model: Path, state: Path) -> TinkerServer:
    return TinkerServer(ServerOptions(model=str(model), state_dir=state, port=0), KEY).setup().start()


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    srv = start(tiny_model_dir, tmp_path_factory.mktemp("tinker_state"))
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: TinkerServer) -> Iterator[Any]:
    service_client = tinker.ServiceClient(base_url=server.base_url, api_key=KEY)
    yield service_client
    service_client.close("success").result()


def datum(tokenizer: Any) -> types.Datum:
    ids = tokenizer.encode(TEXT)
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})


def base_model(server: TinkerServer) -> str:
    assert server.service is not None
    return server.service.settings.base_model


def weights(server: TinkerServer, model_id: str) -> dict[str, Any]:
    assert server.service is not None
    return {k: v.detach().clone() for k, v in adapter_parameters(server.service.trainer.model, model_id).items()}


def test_forward_backward_and_optim_step_change_the_adapter_and_lower_the_loss(server: TinkerServer, client: Any) -> None:
    trainer = client.create_lora_training_client(base_model=base_model(server), rank=4, seed=0).result()
    batch = [datum(trainer.get_tokenizer())]
    before = weights(server, trainer.model_id)
    losses = []
    for _ in range(4):
        result = trainer.forward_backward(batch, "cross_entropy")
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(result.result().metrics["loss:sum"])
    after = weights(server, trainer.model_id)
    assert any(not (before[k] == after[k]).all() for k in before)
    assert losses[-1] < losses[0]
    logprobs = trainer.forward(batch, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert -sum(logprobs) < losses[-1]  # the last step lowered it again


def test_sampling_returns_the_engines_tokens_and_logprobs(server: TinkerServer, client: Any) -> None:
    trainer = client.create_lora_training_client(base_model=base_model(server), rank=4, seed=1).result()
    tokenizer = trainer.get_tokenizer()
    trainer.forward_backward([datum(tokenizer)], "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    sampler = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
    prompt = tokenizer.encode("Hello")
    params = types.SamplingParams(max_tokens=5, temperature=0.8, seed=7)
    got = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    assert len(got.sequences) == 2 and all(len(s.tokens) == 5 for s in got.sequences)
    # the same request straight to the engine, on the training client's adapter
    assert server.service is not None
    engine = server.service.engine
    import asyncio

    direct = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=5, temperature=0.8, seed=7, n=2),
                                         model=trainer.model_id))
    assert [s.tokens for s in got.sequences] == [c.token_ids for c in direct]
    for seq, completion in zip(got.sequences, direct, strict=True):
        assert seq.logprobs == pytest.approx(completion.logprobs, abs=1e-6)
    # and they are the trained model's: a forward of the sequence (at temperature 1: greedy has the same logprob)
    greedy = sampler.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
                            ).result().sequences[0]
    full = prompt + greedy.tokens
    scored = trainer.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                          loss_fn_inputs={"target_tokens": full[1:]})], "cross_entropy").result()
    recomputed = scored.loss_fn_outputs[0]["logprobs"].tolist()[len(prompt) - 1:]
    assert recomputed == pytest.approx(greedy.logprobs, abs=1e-4)


def test_two_training_clients_are_isolated(server: TinkerServer, client: Any) -> None:
    first = client.create_lora_training_client(base_model=base_model(server), rank=4, seed=2).result()
    second = client.create_lora_training_client(base_model=base_model(server), rank=8, seed=3).result()
    batch = [datum(first.get_tokenizer())]
    second.forward_backward(batch, "cross_entropy").result()  # pending gradients of its own
    untouched = weights(server, second.model_id)
    for _ in range(2):
        first.forward_backward(batch, "cross_entropy")
        first.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    now = weights(server, second.model_id)
    assert all(bool((untouched[k] == now[k]).all()) for k in untouched)


def test_not_served_features_are_refused_by_name(server: TinkerServer, client: Any) -> None:
    trainer = client.create_lora_training_client(base_model=base_model(server), rank=4).result()
    tokenizer = trainer.get_tokenizer()
    ids = tokenizer.encode(TEXT)
    rl = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                     loss_fn_inputs={"target_tokens": ids[1:], "logprobs": [-1.0] * (len(ids) - 1),
                                     "advantages": [1.0] * (len(ids) - 1)})
    with pytest.raises(tinker.BadRequestError, match="loss_fn='cispo' is not served"):
        trainer.forward_backward([rl], "cispo").result()
    sampler = client.create_sampling_client(base_model=base_model(server)).result()
    with pytest.raises(tinker.BadRequestError, match=r"stop=\[\]"):
        sampler.sample(types.ModelInput.from_ints(ids[:3]), 1, types.SamplingParams(max_tokens=2, stop=[])).result()
    with pytest.raises(tinker.BadRequestError, match="base_model='Qwen/Qwen3-8B'"):
        client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
    answer = httpx.post(f"{server.base_url}/api/v1/copy_weights", json={}, headers={"X-API-Key": KEY})
    assert answer.status_code == 400 and "POST /api/v1/copy_weights is not served" in answer.text
    for route in ("save_weights", "save_weights_for_sampler"):  # a malformed expiry is refused by name
        answer = httpx.post(f"{server.base_url}/api/v1/{route}", headers={"X-API-Key": KEY},
                            json={"model_id": trainer.model_id, "path": "x", "ttl_seconds": -5, "seq_id": 1,
                                  "type": route})
        assert answer.status_code == 400 and "ttl_seconds=-5" in answer.text, answer.text


def test_a_checkpoint_with_a_ttl_expires(server: TinkerServer, client: Any) -> None:
    """What tinker-cookbook's periodic saves ask (ttl_seconds=604800): the expiry is listed, and a
    checkpoint past it is deleted and answers as missing; one without a ttl stays."""
    trainer = client.create_lora_training_client(base_model=base_model(server), rank=4).result()
    kept = trainer.save_state("kept").result().path
    short = trainer.save_state("short", ttl_seconds=1).result().path
    week = trainer.save_weights_for_sampler("week", ttl_seconds=604800).result().path
    rest = tinker.RestClient(base_url=server.base_url, api_key=KEY)
    listed = {c.tinker_path: c for c in rest.list_checkpoints(trainer.model_id).result().checkpoints}
    assert listed.keys() == {kept, short, week}
    assert listed[kept].expires_at is None and listed[week].expires_at is not None
    assert listed[week].expires_at - listed[week].time > timedelta(days=6)
    time.sleep(1.2)
    listed_after = [c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result().checkpoints]
    assert sorted(listed_after) == sorted([kept, week])
    assert server.service is not None
    assert not server.service.store.directory(parse_path(short)).exists()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        client.create_training_client_from_state(short).result()


def test_rl_losses_train(server: TinkerServer, client: Any) -> None:
    trainer = client.create_lora_training_client(base_model=base_model(server), rank=4, seed=4).result()
    ids = trainer.get_tokenizer().encode(TEXT)
    n = len(ids) - 1
    old = trainer.forward([datum(trainer.get_tokenizer())], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    rl = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                     loss_fn_inputs={"target_tokens": ids[1:], "logprobs": old, "advantages": [1.0] * n})
    for loss_fn in ("importance_sampling", "ppo"):
        out = trainer.forward_backward([rl], loss_fn).result()
        assert out.metrics["loss:sum"] == pytest.approx(-n, rel=1e-4)  # ratio 1 at the old weights
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    new = trainer.forward([datum(trainer.get_tokenizer())], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert sum(new) > sum(old)  # positive advantages raised the tokens' logprobs


def test_the_key_is_checked_before_the_body(server: TinkerServer) -> None:
    url = f"{server.base_url}/api/v1/create_session"
    assert httpx.post(url, json={}).status_code == 401
    assert httpx.post(url, json={}, headers={"X-API-Key": "tml-wrong"}).status_code == 401
    huge = b"x" * (65 << 20)  # over the cap: refused for the key before it is read
    assert httpx.post(url, content=huge, headers={"X-API-Key": "tml-wrong"}).status_code == 401
    assert httpx.post(url, content=huge, headers={"X-API-Key": KEY}).status_code == 413
    assert httpx.get(f"{server.base_url}/api/v1/healthz", headers={"X-API-Key": KEY}).json() == {"status": "ok"}


def test_a_restart_keeps_checkpoints_and_fails_old_futures(tiny_model_dir: Path, tmp_path: Path) -> None:
    first = start(tiny_model_dir, tmp_path)
    client = tinker.ServiceClient(base_url=first.base_url, api_key=KEY)
    trainer = client.create_lora_training_client(base_model=base_model(first), rank=4, seed=5).result()
    batch = [datum(trainer.get_tokenizer())]
    trainer.forward_backward(batch, "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = trainer.save_state("ckpt").result().path
    saved = weights(first, trainer.model_id)
    # a request that is still running when the service stops fails at once
    assert first.service is not None
    slow = first.service.trainer.forward_backward

    def stall(request: Any) -> Any:
        time.sleep(3)
        return slow(request)

    first.service.trainer.forward_backward = stall  # type: ignore[method-assign]
    pending = trainer.forward_backward(batch, "cross_entropy")
    threading.Timer(0.5, first.stop).start()
    with pytest.raises(tinker.RequestFailedError, match="stopped"):
        pending.result(timeout=60)

    second = start(tiny_model_dir, tmp_path)
    try:
        rest = tinker.RestClient(base_url=second.base_url, api_key=KEY)
        listed = [c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result().checkpoints]
        assert listed == [path]
        client2 = tinker.ServiceClient(base_url=second.base_url, api_key=KEY)
        resumed = client2.create_training_client_from_state_with_optimizer(path).result()
        assert all(bool((saved[k.replace(resumed.model_id, trainer.model_id)] == v).all())
                   for k, v in weights(second, resumed.model_id).items())
        old = httpx.post(f"{second.base_url}/api/v1/retrieve_future",
                         json={"request_id": f"{first.service.futures.boot}-1"}, headers={"X-API-Key": KEY}).json()
        assert "earlier run of this service" in old["error"]
        client2.close("success").result()
    finally:
        second.stop()


def test_a_malformed_expiry_never_expires_and_breaks_nothing(tmp_path: Path) -> None:
    """A meta.json whose expires_at this service did not write (garbage, a naive time) is kept:
    the sweep that runs before every save, listing and load must not fail on it."""
    store = CheckpointStore(tmp_path)
    store.add_run(RunRecord("m:train:0", "base", 4, 8, True, True, True, "now", {}))
    for name, expires in (("garbage", "next tuesday"), ("naive", "2000-01-01T00:00:00"), ("past", "2000-01-01T00:00:00+00:00")):
        store.write(CheckpointRef("m:train:0", "weights", name), lambda d: None, {"expires_at": expires})
    assert store.sweep("m:train:0") == ["tinker://m:train:0/weights/past"]
    assert sorted(c["checkpoint_id"] for c in store.checkpoints("m:train:0")) == ["weights/garbage", "weights/naive"]
    assert json.loads((store.directory(CheckpointRef("m:train:0", "weights", "naive")) / "meta.json").read_text())[
        "expires_at"] == "2000-01-01T00:00:00"
