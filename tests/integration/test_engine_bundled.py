"""LocalEngine + ChatFormat on the bundled SmolLM2-135M-Instruct: a realistic chat reply."""

from __future__ import annotations

import asyncio

import pytest
import torch

from ajet.engine.base import SamplingParams

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def setup(bundled_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ajet.engine.chat import ChatFormat
    from ajet.engine.local import LocalEngine

    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    engine = LocalEngine(model, tokenizer, max_batch_size=8)
    yield engine, ChatFormat(tokenizer), model
    engine.close()


def prompt_ids(chat, question):
    return chat.encode(chat.render([{"role": "user", "content": question}]))


def test_greedy_reply_stops_at_eos_and_parses(setup):
    engine, chat, _ = setup
    (reply,) = asyncio.run(
        engine.generate(
            prompt_ids(chat, "What is 2+3?"), SamplingParams(temperature=0, max_tokens=48)
        )
    )
    assert reply.finish_reason == "stop"
    assert reply.token_ids[-1] in chat.eos_token_ids  # <|im_end|> kept for the trainer
    assert "5" in reply.text and "<|im_end|>" not in reply.text
    assert reply.text == chat.decode(reply.token_ids[:-1])
    message = chat.to_openai_message(chat.parse_completion(reply.text))
    assert message == {"role": "assistant", "content": reply.text}


def test_sampled_logprobs_match_a_full_forward(setup):
    engine, chat, model = setup
    prompt = prompt_ids(chat, "Write a haiku about rain.")
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=0)
    (completion,) = asyncio.run(engine.generate(prompt, params))
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion.token_ids])).logits[0]
    logprobs = torch.log_softmax(logits / 0.8, dim=-1)
    expected = [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(completion.token_ids)]
    assert max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=True)) < 1e-4


def test_batched_greedy_equals_one_at_a_time(setup):
    engine, chat, _ = setup
    questions = [
        "Name the capital of France.",
        "What color is the sky?",
        "Explain photosynthesis briefly.",
    ]
    prompts = [prompt_ids(chat, q) for q in questions]
    params = SamplingParams(temperature=0, max_tokens=16)

    async def together():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    batched = asyncio.run(together())
    assert engine.stats["max_batch"] >= 2  # they did share decode steps
    for prompt, (completion,) in zip(prompts, batched, strict=True):
        (alone,) = asyncio.run(engine.generate(prompt, params))
        assert completion.token_ids == alone.token_ids
