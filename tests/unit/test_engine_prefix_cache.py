"""The prefix KV cache: the radix tree alone (matching, splitting, LRU under a budget, locks,
invalidation) and the engine with it on: exactly the tokens and logprobs of the cache off."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from tiny_models import load_peaky

from ajet.engine.base import SamplingParams
from ajet.engine.prefix_cache import PrefixCache, shared_prefixes

LAYERS, HEADS, DIM = 2, 1, 2


def fake_kv(ids):
    """KV whose values encode the token ids, so a test can see which tokens a match returns."""
    t = torch.tensor(ids, dtype=torch.float32)
    return t.view(1, 1, 1, -1, 1).expand(LAYERS, 2, HEADS, len(ids), DIM).clone()


def insert(cache, ids):
    return cache.insert(ids, lambda a, b: fake_kv(ids)[:, :, :, a:b].clone())


def matched_ids(match):
    if not match.segments:
        return []
    return torch.cat(match.segments, dim=3)[0, 0, 0, :, 0].long().tolist()


def test_match_returns_longest_cached_prefix_across_splits():
    cache = PrefixCache(100)
    assert insert(cache, [1, 2, 3, 4, 5]) == 5
    assert insert(cache, [1, 2, 3, 9]) == 1  # splits the edge after [1, 2, 3]
    assert insert(cache, [1, 2, 3, 4, 5]) == 0
    assert cache.tokens == 6
    for ids, expected in [
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5]),
        ([1, 2, 3, 9, 9], [1, 2, 3, 9]),
        ([1, 2, 3, 4, 7], [1, 2, 3, 4]),  # ends inside an edge
        ([2, 2], []),
    ]:
        match = cache.match(ids)
        assert match.length == len(expected) and matched_ids(match) == expected
        match.release()
    match = cache.match([1, 2, 3, 4, 5], max_length=4)
    assert match.length == 4 and matched_ids(match) == [1, 2, 3, 4]
    match.release()


def test_lru_eviction_keeps_the_budget_and_recent_prefixes():
    cache = PrefixCache(8)
    insert(cache, [1, 1, 1, 1])
    insert(cache, [2, 2, 2, 2])
    cache.match([1, 1, 1, 1]).release()  # [1...] is now the more recently used
    insert(cache, [3, 3, 3, 3])
    assert cache.tokens == 8 and cache.evicted_tokens == 4
    lengths = {}
    for first in (1, 2, 3):
        match = cache.match([first] * 4)
        lengths[first] = match.length
        match.release()
    assert lengths == {1: 4, 2: 0, 3: 4}


def test_a_locked_prefix_is_never_evicted():
    cache = PrefixCache(4)
    insert(cache, [1, 1, 1, 1])
    held = cache.match([1, 1, 1, 1, 5])
    insert(cache, [2, 2, 2, 2])  # over budget, but [1...] is locked: [2...] goes
    again = cache.match([1, 1, 1, 1])
    assert again.length == 4 and matched_ids(again) == [1, 1, 1, 1]
    again.release()
    held.release()
    insert(cache, [3, 3, 3, 3])  # unlocked now: [1...] is the least recently used
    assert cache.match([1, 1, 1, 1]).length == 0
    assert cache.tokens <= 4


def test_a_locked_node_split_by_an_insert_stays_protected():
    cache = PrefixCache(6)
    insert(cache, [1, 2, 3, 4])
    held = cache.match([1, 2, 3, 4])
    insert(cache, [1, 2, 7])  # splits the held edge
    insert(cache, [5, 5, 5, 5])  # over budget: only unlocked leaves ([1, 2, 7], [5...]) may go
    probe = cache.match([1, 2, 3, 4])
    assert probe.length == 4 and matched_ids(probe) == [1, 2, 3, 4]
    probe.release()
    held.release()


def test_sync_drops_everything_from_another_version():
    cache = PrefixCache(100)
    insert(cache, [1, 2, 3])
    cache.sync(0)
    assert cache.match([1, 2, 3]).length == 3
    cache.sync(1)
    assert cache.tokens == 0 and cache.match([1, 2, 3]).length == 0


def test_shared_prefixes_layers_system_then_task_prompts():
    system = list(range(100, 120))
    tasks = [system + [t] * 5 for t in (1, 2, 3)]
    prompts = [task + [50 + e] for task in tasks for e in range(2)]  # 2 episodes per task
    prompts += [task for task in tasks[:1]] * 2  # identical prompts share all but the last token
    layers = shared_prefixes(prompts, min_tokens=8)
    # Each prefix is prefilled after those it extends: system, then task 1 short of the
    # token its two identical prompts forward themselves, then the task prompts.
    assert layers == [[system], [tasks[0][:-1]], sorted(tasks)]
    assert shared_prefixes([[1, 2, 3], [4, 5, 6]], min_tokens=1) == []


# ---------------------------------------------------------------- the engine with the cache


@pytest.fixture(scope="module")
def peaky(tiny_model_dir):
    """The tiny model with larger random weights, so greedy output varies token to token, and
    logits scaled up so that a sampled token does not hinge on float noise (load_peaky)."""
    return load_peaky(tiny_model_dir, 1234, logit_scale=4.0)


def make_engine(peaky, budget):
    from ajet.engine.local import LocalEngine

    model, tokenizer = peaky
    return LocalEngine(model, tokenizer, max_batch_size=16, prefix_cache_tokens=budget)


def together(engine, requests):
    """Run the requests admitted in one batch (queued while the engine is paused). Each is
    (prompt, params) or (prompt, params, model): the adapter or frozen model that serves it."""
    calls = [(*request, None)[:3] for request in requests]  # (prompt, params, model or None)
    results: list = []

    async def gather():
        return await asyncio.gather(*(engine.generate(prompt, params, model=model)
                                      for prompt, params, model in calls))

    runner = threading.Thread(target=lambda: results.extend(asyncio.run(gather())))
    with engine.paused():
        runner.start()
        deadline = time.monotonic() + 60
        while engine.num_pending < len(requests) and time.monotonic() < deadline:
            time.sleep(0.005)
    runner.join(120)
    assert len(results) == len(requests)
    return results


def agent_episodes(engine, tokenizer, turns=3):
    """Two tasks x two episodes under one system prompt; each turn extends the last prompt
    with its completion and a tool result, as the context tracker builds it."""
    system = tokenizer.encode("System: you are a careful agent with a calculator tool. " * 3)
    prompts = [system + tokenizer.encode(f"Task {t}: add {t} and {t + 1}.") for t in (1, 2) for _ in (0, 1)]
    params = [SamplingParams(temperature=0.8, max_tokens=5 + i, seed=i) for i in range(len(prompts))]
    history = []
    for turn in range(turns):
        results = together(engine, list(zip(prompts, params, strict=True)))
        history.append([(p, r[0]) for p, r in zip(prompts, results, strict=True)])
        tool = tokenizer.encode(f" Tool result {turn}: 42.")
        prompts = [p + r[0].token_ids + tool for p, r in zip(prompts, results, strict=True)]
    return history


def reference_logprobs(model, prompt, completion, temperature):
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, tok]) for i, tok in enumerate(completion)]


def test_cache_on_gives_the_tokens_and_logprobs_of_cache_off(peaky):
    model, tokenizer = peaky
    with make_engine(peaky, 0) as off:
        expected = agent_episodes(off, tokenizer)
        assert off.take_metrics()["engine/cache_hit_rate"] == 0.0
    with make_engine(peaky, 4096) as on:
        got = agent_episodes(on, tokenizer)
        metrics = on.take_metrics()
    for turn_expected, turn_got in zip(expected, got, strict=True):
        for (prompt, a), (prompt_on, b) in zip(turn_expected, turn_got, strict=True):
            assert prompt_on == prompt and b.token_ids == a.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    prompt, last = got[-1][0]
    ref = reference_logprobs(model, prompt, last.token_ids, 0.8)
    assert max(abs(x - y) for x, y in zip(last.logprobs, ref, strict=True)) < 1e-4
    assert len({tuple(c.token_ids) for _, c in got[0]}) > 1  # the episodes really differ
    # Later turns reuse their history, the first turn its shared system and task prompts.
    assert metrics["engine/prefilled_tokens"] < 0.5 * metrics["engine/prompt_tokens"]
    assert metrics["engine/cache_hit_rate"] > 0.5
    assert on.take_metrics()["engine/prompt_tokens"] == 0  # reset by the last call


def test_greedy_n_completions_and_a_repeated_prompt_match_cache_off(peaky):
    _, tokenizer = peaky
    prompt = tokenizer.encode("Question: what is the capital of France? Think step by step.")
    requests = [(prompt, SamplingParams(temperature=0, max_tokens=12)),
                (prompt, SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=7))]
    with make_engine(peaky, 0) as off:
        expected = [asyncio.run(off.generate(p, s)) for p, s in requests]
    with make_engine(peaky, 4096) as on:
        first = [asyncio.run(on.generate(p, s)) for p, s in requests]
        again = [asyncio.run(on.generate(p, s)) for p, s in requests]  # served from the cache
        # Every call after the first finds all of the prompt but the last token cached.
        n = len(prompt)
        assert on.take_metrics()["engine/cache_hit_rate"] == pytest.approx(3 * (n - 1) / (4 * n))
    for exp, a, b in zip(expected, first, again, strict=True):
        for c_exp, c_a, c_b in zip(exp, a, b, strict=True):
            assert c_exp.token_ids == c_a.token_ids == c_b.token_ids
            assert max(abs(x - y) for x, y in zip(c_exp.logprobs, c_b.logprobs, strict=True)) < 1e-4


def test_bump_version_drops_kv_of_the_old_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ajet.engine.local import LocalEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer.encode("A long enough prompt to be worth caching, about some topic.")
    params = SamplingParams(temperature=0, max_tokens=4)
    with LocalEngine(model, tokenizer, prefix_cache_tokens=4096) as engine:
        asyncio.run(engine.generate(prompt, params))
        with engine.paused():  # as the trainer updates weights
            with torch.no_grad():
                for param in model.parameters():
                    param.mul_(1.5)
            engine.bump_version()
        engine.take_metrics()
        (after,) = asyncio.run(engine.generate(prompt, params))
        assert engine.take_metrics()["engine/cache_hit_rate"] == 0.0  # nothing old served
    ref = reference_logprobs(model, prompt, after.token_ids, 1.0)
    assert max(abs(x - y) for x, y in zip(after.logprobs, ref, strict=True)) < 1e-4


def test_a_frozen_namespace_keeps_its_kv_across_versions():
    """A frozen model's KV (`keep`) survives a weight update and a drop; the policy's does not."""
    frozen = ("initial", None)
    cache = PrefixCache(100, keep=lambda namespace: namespace == frozen)
    cache.insert([1, 2, 3], lambda a, b: fake_kv([1, 2, 3])[:, :, :, a:b].clone())
    cache.insert([1, 2, 3, 4], lambda a, b: fake_kv([1, 2, 3, 4])[:, :, :, a:b].clone(), frozen)
    assert cache.tokens == 7
    cache.sync(1)
    assert cache.match([1, 2, 3]).length == 0
    assert matched_ids(cache.match([1, 2, 3, 4, 5], namespace=frozen)) == [1, 2, 3, 4]
    assert cache.tokens == 4
    cache.clear()
    assert cache.tokens == 4 and cache.match([1, 2, 3, 4], namespace=frozen).length == 4


def test_frozen_namespaces_are_the_frozen_models_and_the_lora_base():
    from ajet.engine.requests import POLICY
    from ajet.engine.served_models import BASE_ADAPTER, frozen_namespace

    assert frozen_namespace(("initial", None)) and frozen_namespace(("/ckpt", None))
    assert frozen_namespace((POLICY, BASE_ADAPTER))  # LoRA: the base never trains
    assert not frozen_namespace(None) and not frozen_namespace((POLICY, "werewolf"))
