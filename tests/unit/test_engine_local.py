"""LocalEngine mechanics on a tiny random Llama (fast): batching, sampling, stops, failures."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from tiny_models import load_peaky

from ajet.engine.base import SamplingParams


@pytest.fixture(scope="module")
def peaky(tiny_model_dir):
    """The tiny model with larger random weights: its greedy output varies token to token
    (the default init repeats one token forever, which would make equality tests vacuous)."""
    return load_peaky(tiny_model_dir, 1234)


@pytest.fixture
def engine(peaky):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    eng = LocalEngine(model, tokenizer, max_batch_size=8)
    yield eng
    eng.close()


def prompts(tokenizer, count):
    # Different lengths, so batched rows are padded differently.
    return [
        tokenizer.encode(f"Question {i}: " + "tell me more " * (i % 4 + 1)) for i in range(count)
    ]


def reference_greedy(model, prompt, steps):
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def reference_logprobs(model, prompt, completion, temperature):
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, tok]) for i, tok in enumerate(completion)]


async def gather(engine, requests, return_exceptions=False):
    calls = (engine.generate(p, params) for p, params in requests)
    return await asyncio.gather(*calls, return_exceptions=return_exceptions)


def one_batch(engine, requests):
    """Queue every request while the engine is paused, so they are admitted together."""
    requests = list(requests)
    results: list = []
    runner = threading.Thread(
        target=lambda: results.extend(asyncio.run(gather(engine, requests, True)))
    )
    with engine.paused():
        runner.start()
        while engine.num_pending < len(requests):
            time.sleep(0.005)
    runner.join(120)
    return results


def test_batched_greedy_equals_unbatched_and_reference(engine, peaky):
    model, tokenizer = peaky
    ps = prompts(tokenizer, 6)
    params = [SamplingParams(temperature=0, max_tokens=6 + 2 * i) for i in range(6)]
    results = one_batch(engine, zip(ps, params, strict=True))
    assert engine.stats["max_batch"] == 6
    for prompt, param, (batched,) in zip(ps, params, results, strict=True):
        (alone,) = asyncio.run(engine.generate(prompt, param))
        assert batched.token_ids == alone.token_ids
        assert batched.token_ids == reference_greedy(model, prompt, param.max_tokens)
        # Batched (left-padded) prefill and padded decode steps: still the exact logprobs.
        expected = reference_logprobs(model, prompt, batched.token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(batched.logprobs, expected, strict=True)) < 1e-4
        assert batched.finish_reason == "length"
        assert len(set(batched.token_ids)) > 1  # the peaky model really varies


def test_requests_joining_mid_flight_match_reference(engine, peaky):
    model, tokenizer = peaky
    ps = prompts(tokenizer, 4)

    async def staggered():
        tasks = []
        for i, prompt in enumerate(ps):
            tasks.append(
                asyncio.create_task(
                    engine.generate(prompt, SamplingParams(temperature=0, max_tokens=12))
                )
            )
            await asyncio.sleep(0.02 * i)
        return await asyncio.gather(*tasks)

    results = asyncio.run(staggered())
    for prompt, (completion,) in zip(ps, results, strict=True):
        assert completion.token_ids == reference_greedy(model, prompt, 12)


def test_concurrent_callers_on_two_threads_and_loops(engine, peaky):
    _, tokenizer = peaky
    ps = prompts(tokenizer, 8)
    outputs: dict[int, list] = {}

    def worker(slot, chunk):
        outputs[slot] = asyncio.run(
            gather(engine, [(p, SamplingParams(temperature=0, max_tokens=8)) for p in chunk])
        )

    threads = [threading.Thread(target=worker, args=(k, ps[k::2])) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(outputs) == [0, 1]
    got = {
        tuple(p): res[0].token_ids
        for k in range(2)
        for p, res in zip(ps[k::2], outputs[k], strict=True)
    }
    for prompt in ps:
        (alone,) = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0, max_tokens=8)))
        assert got[tuple(prompt)] == alone.token_ids


@pytest.mark.parametrize(
    ("temperature", "lp_temperature", "expected_t"),
    [(0.7, None, 0.7), (0.7, 1.0, 1.0), (0.0, None, 1.0), (1.3, None, 1.3)],
)
def test_logprobs_match_a_reference_forward(engine, peaky, temperature, lp_temperature, expected_t):
    model, tokenizer = peaky
    prompt = prompts(tokenizer, 3)[2]
    params = SamplingParams(
        temperature=temperature,
        top_k=40,
        max_tokens=10,
        n=2,
        seed=3,
        logprob_temperature=lp_temperature,
    )
    completions = asyncio.run(engine.generate(prompt, params))
    assert len(completions) == 2
    for completion in completions:
        expected = reference_logprobs(model, prompt, completion.token_ids, expected_t)
        assert len(completion.logprobs) == len(completion.token_ids) == 10
        assert max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=True)) < 1e-4


def test_seed_reproducible_and_n_completions_differ(engine, peaky):
    _, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]
    params = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=7)
    first = asyncio.run(engine.generate(prompt, params))
    # Same seed, now sharing the batch with other traffic: same tokens.
    other = SamplingParams(temperature=1.0, max_tokens=5, n=2)
    second, _ = asyncio.run(gather(engine, [(prompt, params), (prompts(tokenizer, 2)[1], other)]))
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert len({tuple(c.token_ids) for c in first}) == 3  # the n completions are distinct samples
    third = asyncio.run(
        engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=8))
    )
    assert [c.token_ids for c in third] != [c.token_ids for c in first]


def test_top_k_one_is_greedy(engine, peaky):
    _, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]
    (sampled,) = asyncio.run(
        engine.generate(prompt, SamplingParams(temperature=1.5, top_k=1, max_tokens=8))
    )
    (greedy,) = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0, max_tokens=8)))
    assert sampled.token_ids == greedy.token_ids


def test_stop_string_cuts_text_and_keeps_completing_token(engine, peaky):
    _, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]
    (full,) = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0, max_tokens=16)))
    text = tokenizer.decode(full.token_ids, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop and text.find(stop) > 0
    # The first token count whose decoded text contains the stop string.
    k = next(
        i
        for i in range(1, 17)
        if stop in tokenizer.decode(full.token_ids[:i], skip_special_tokens=True)
    )
    (cut,) = asyncio.run(
        engine.generate(
            prompt, SamplingParams(temperature=0, max_tokens=16, stop=[stop, "\x00never"])
        )
    )
    assert cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[:k]
    assert cut.text == text[: text.find(stop)]
    assert len(cut.logprobs) == k


def test_eos_ends_with_stop_and_is_kept(peaky):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]
    greedy = reference_greedy(model, prompt, 10)
    k = next(i for i in range(2, 10) if greedy[i] not in greedy[:i])
    with LocalEngine(model, tokenizer, eos_token_ids=[greedy[k]]) as eng:
        (completion,) = asyncio.run(
            eng.generate(prompt, SamplingParams(temperature=0, max_tokens=10))
        )
    assert completion.finish_reason == "stop"
    assert completion.token_ids == greedy[: k + 1]  # EOS included: the trainer learns to stop
    assert completion.text == tokenizer.decode(greedy[:k], skip_special_tokens=True)


def test_default_eos_comes_from_tokenizer(engine, peaky):
    _, tokenizer = peaky
    assert tokenizer.eos_token_id in engine.eos_token_ids


def test_max_tokens_and_max_model_len(peaky):
    from ajet.engine.local import LocalEngine
    from ajet.engine.requests import PromptTooLongError

    model, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]
    with LocalEngine(model, tokenizer, max_model_len=len(prompt) + 4) as eng:
        (capped,) = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0, max_tokens=50)))
        assert capped.finish_reason == "length" and len(capped.token_ids) == 4
        with pytest.raises(PromptTooLongError, match="max_model_len"):
            asyncio.run(eng.generate(prompt + [5] * 4, SamplingParams()))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            asyncio.run(eng.generate([10**7], SamplingParams()))
        with pytest.raises(ValueError, match="top_p"):
            asyncio.run(eng.generate(prompt, SamplingParams(top_p=0)))
        (ok,) = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0, max_tokens=2)))
        assert len(ok.token_ids) == 2  # still serving


def test_failed_request_does_not_kill_others(engine, peaky, monkeypatch):
    import ajet.engine.decode as decode

    _, tokenizer = peaky
    real, real_rows = decode.choose_token, decode.choose_tokens

    calls = {"bad": 0}

    def flaky(logits, params, generator):  # prefill: one row at a time
        if params.seed == 665:
            raise FloatingPointError("boom")
        return real(logits, params, generator)

    def flaky_rows(logits, params, generators):  # decode: a failing row gets its exception
        choices = real_rows(logits, params, generators)
        for i, p in enumerate(params):
            if p.seed == 666:
                calls["bad"] += 1
                if calls["bad"] >= 3:  # seed 666 fails in a later decode step
                    choices[i] = FloatingPointError("boom")
        return choices

    monkeypatch.setattr(decode, "choose_token", flaky)
    monkeypatch.setattr(decode, "choose_tokens", flaky_rows)
    ps = prompts(tokenizer, 3)
    good = [(p, SamplingParams(temperature=0, max_tokens=6)) for p in ps]
    bad = [(ps[0], SamplingParams(temperature=0.5, max_tokens=6, seed=s)) for s in (665, 666)]
    *results, failed_prefill, failed_decode = one_batch(engine, good + bad)
    assert isinstance(failed_prefill, FloatingPointError)
    assert isinstance(failed_decode, FloatingPointError)
    assert engine.stats["max_batch"] == 4  # the one failing in decode shared the batch
    for (prompt, _), res in zip(good, results, strict=True):
        assert res[0].token_ids == reference_greedy(peaky[0], prompt, 6)


@pytest.mark.parametrize("fused", [True, False], ids=["fused_step", "hf_forward"])
def test_failed_decode_step_fails_its_batch_and_engine_keeps_serving(peaky, monkeypatch, fused):
    from ajet.engine.fused_decode import LlamaDecodeStep
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    ps = prompts(tokenizer, 2)
    calls = {"n": 0}

    def exploding(real):
        def call(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("decode exploded")
            return real(*args, **kwargs)
        return call

    with LocalEngine(model, tokenizer, max_batch_size=8, fused_decode=fused) as engine:
        assert (engine._batch.fused is not None) == fused  # the tiny model is a plain Llama
        if fused:  # the decode steps; prefills go through the model's forward
            monkeypatch.setattr(LlamaDecodeStep, "__call__", exploding(LlamaDecodeStep.__call__))
        else:
            real_forward = model.forward
            decode_forward = exploding(real_forward)
            monkeypatch.setattr(model, "forward", lambda *a, **kw: (
                decode_forward if kw["input_ids"].shape[1] == 1 else real_forward)(*a, **kw))
        results = one_batch(engine, [(p, SamplingParams(temperature=0, max_tokens=5)) for p in ps])
        assert all(isinstance(r, RuntimeError) and "decode exploded" in str(r) for r in results)
        monkeypatch.undo()
        (after,) = asyncio.run(engine.generate(ps[0], SamplingParams(temperature=0, max_tokens=5)))
    assert after.token_ids == reference_greedy(model, ps[0], 5)


def test_failed_batched_prefill_falls_back_to_one_by_one(engine, peaky, monkeypatch):
    model, tokenizer = peaky
    poison = 7777
    real_forward = model.forward

    def forward(*args, **kwargs):
        if (kwargs["input_ids"] == poison).any():
            raise RuntimeError("poisoned prompt")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    ps = prompts(tokenizer, 3)
    requests = [(p, SamplingParams(temperature=0, max_tokens=4)) for p in ps]
    requests.append((ps[0] + [poison], SamplingParams(temperature=0, max_tokens=4)))
    *good, bad = one_batch(engine, requests)
    monkeypatch.setattr(model, "forward", real_forward)
    assert isinstance(bad, RuntimeError) and "poisoned" in str(bad)
    for prompt, res in zip(ps, good, strict=True):
        assert res[0].token_ids == reference_greedy(peaky[0], prompt, 4)


def test_prefill_groups_bound_padding_and_size():
    from ajet.engine.requests import prefill_groups

    lengths = [40, 38, 400, 41, 39, 3000, 410]
    groups = prefill_groups(lengths, max_padding=0.25, max_tokens=2048)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        widths = [lengths[i] for i in group]
        assert max(widths) * len(widths) <= max(1.25 * sum(widths), max(widths))
        assert len(group) == 1 or max(widths) * len(widths) <= 2048
    assert sorted(map(sorted, groups)) == [[0, 1, 3, 4], [2, 6], [5]]


def test_version_bump_and_load_state_dict(engine, peaky):
    model, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]
    params = SamplingParams(temperature=0, max_tokens=6)
    (before,) = asyncio.run(engine.generate(prompt, params))
    assert before.policy_version == 0
    assert engine.bump_version() == 1
    (after,) = asyncio.run(engine.generate(prompt, params))
    assert after.policy_version == 1 and after.token_ids == before.token_ids
    original = {k: v.clone() for k, v in model.state_dict().items()}
    changed = {k: (v * 1.5 if v.dim() >= 2 else v) for k, v in original.items()}
    try:
        assert engine.load_state_dict(changed) == 2
        (new,) = asyncio.run(engine.generate(prompt, params))
        assert new.policy_version == 2
        assert new.token_ids == reference_greedy(model, prompt, 6)
        assert new.token_ids != before.token_ids
    finally:
        model.load_state_dict(original)


def test_pause_holds_decoding_until_resume(engine, peaky):
    _, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]
    result: list = []
    runner = threading.Thread(
        target=lambda: result.extend(
            asyncio.run(engine.generate(prompt, SamplingParams(temperature=0, max_tokens=1000)))
        )
    )
    runner.start()
    while engine.stats["decode_steps"] < 3:
        time.sleep(0.005)
    engine.pause()
    steps = engine.stats["decode_steps"]
    time.sleep(0.2)
    assert engine.stats["decode_steps"] == steps and not result
    engine.resume()
    runner.join(60)
    assert len(result[0].token_ids) == 1000


def test_cancelled_request_leaves_the_batch(engine, peaky):
    _, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]

    async def cancel_one():
        task = asyncio.create_task(
            engine.generate(prompt, SamplingParams(temperature=0, max_tokens=1500))
        )
        while engine.num_active == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(500):
            if engine.num_active == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(cancel_one())


def test_close_fails_waiting_requests(peaky):
    from ajet.engine.local import LocalEngine
    from ajet.engine.requests import EngineClosedError

    model, tokenizer = peaky
    eng = LocalEngine(model, tokenizer)
    errors: list = []

    def waiter():
        try:
            asyncio.run(eng.generate([1, 2, 3], SamplingParams(max_tokens=3)))
        except EngineClosedError as exc:
            errors.append(exc)

    eng.pause()
    thread = threading.Thread(target=waiter)
    thread.start()
    while eng.num_pending == 0:
        time.sleep(0.005)
    eng.close()
    thread.join(30)
    assert len(errors) == 1
    with pytest.raises(EngineClosedError):
        asyncio.run(eng.generate([1, 2, 3], SamplingParams()))


def test_on_token_streams_every_token_before_the_result(engine, peaky):
    _, tokenizer = peaky
    prompt_a, prompt_b = prompts(tokenizer, 2)

    async def run():
        streamed: list[int] = []
        seen_at_result: list[int] = []
        task = asyncio.ensure_future(
            engine.generate(prompt_a, SamplingParams(temperature=0.8, max_tokens=12, seed=1),
                            on_token=streamed.append))
        task.add_done_callback(lambda _: seen_at_result.append(len(streamed)))
        other = engine.generate(prompt_b, SamplingParams(temperature=0, max_tokens=12))  # batched beside it
        (completion,), _ = await asyncio.gather(task, other)
        return completion, streamed, seen_at_result

    completion, streamed, seen_at_result = asyncio.run(run())
    assert streamed == completion.token_ids and len(streamed) >= 2
    assert seen_at_result == [len(completion.token_ids)]  # all tokens arrived before the result
    with pytest.raises(ValueError, match="on_token streams one completion"):
        asyncio.run(engine.generate(prompt_a, SamplingParams(n=2, max_tokens=2), on_token=print))


def test_a_full_waiting_queue_refuses_at_once_naming_the_setting(peaky) -> None:
    """Before (issue 53) the engine queued every request: a flood of clients grew it without bound."""
    from ajet.engine.local import LocalEngine
    from ajet.engine.requests import EngineBusyError

    model, tokenizer = peaky
    prompt = prompts(tokenizer, 1)[0]

    async def flood(eng: LocalEngine) -> list:
        calls = [eng.generate(prompt, SamplingParams(temperature=0, max_tokens=30)) for _ in range(6)]
        return await asyncio.gather(*calls, return_exceptions=True)

    with LocalEngine(model, tokenizer, max_batch_size=1, max_waiting=2) as eng:
        results = asyncio.run(flood(eng))
    busy = [r for r in results if isinstance(r, EngineBusyError)]
    served = [r for r in results if isinstance(r, list)]
    assert len(busy) + len(served) == 6 and 1 <= len(busy) <= 4 and len(served) >= 2
    assert "rollout.max_waiting_requests=2" in str(busy[0])
