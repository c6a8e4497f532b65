"""Merging and tree packing are lossless on a real model and a real tokenizer.

- the tracker with the bundled tokenizer's ChatML template: prompts built by
  extension equal re-tokenizing the full render, and sampled token ids are kept as is;
- logits of a tree-packed batch equal separate forwards (tiny and bundled model);
- the loss and gradient from merged + packed samples equal those from one sample per
  call, for token_mean, seq_mean and episode_mean.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from ajet.algorithms.losses import policy_loss
from ajet.config.schema import ContextConfig, LossAgg
from ajet.context.diagnostics import check_prefix_preserving
from ajet.context.loss_weights import loss_weights
from ajet.context.merge import merge_timelines, per_call_samples, timelines_to_samples
from ajet.context.pack import pack_samples, pack_stats
from ajet.context.tracker import ContextTracker
from ajet.context.types import LLMCall
from ajet.engine.chat import ChatFormat
from ajet.forward.packed import forward_packed

pytestmark = pytest.mark.integration


class HFChatML:
    """A minimal ChatRenderer over a Hugging Face tokenizer's own chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eos_token_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>")}

    def render(self, messages, tools=None, add_generation_prompt=True) -> str:
        plain = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(b.get("text", "") for b in content)
            content = content or ""
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                args = fn["arguments"]
                args = json.loads(args) if isinstance(args, str) else args
                content += (
                    "<tool_call>"
                    + json.dumps({"name": fn["name"], "arguments": args})
                    + "</tool_call>"
                )
            plain.append({"role": m["role"], "content": content})
        return self.tok.apply_chat_template(
            plain, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def renderer(bundled_model_dir):
    from transformers import AutoTokenizer

    return HFChatML(AutoTokenizer.from_pretrained(bundled_model_dir))


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


class Driver:
    """Plays an agent against a tracker; 'rollout' logprobs come from `model` plus noise."""

    def __init__(self, renderer: HFChatML, model=None, roles=None) -> None:
        self.r = renderer
        self.model = model
        self.tracker = ContextTracker(renderer, roles, ContextConfig())

    def call(self, role, messages, reply, *, eos=True, completion_ids=None) -> LLMCall:
        prompt = self.tracker.build_prompt(role, messages, None)
        ids = list(completion_ids) if completion_ids is not None else self.r.encode(reply)
        ids += [next(iter(self.r.eos_token_ids))] if eos else []
        call = LLMCall(
            role=role,
            prompt_ids=prompt,
            completion_ids=ids,
            completion_logprobs=self._logprobs(prompt, ids),
            finish_reason="stop" if eos else "length",
            policy_version=0,
            messages=[dict(m) for m in messages],
            response_message={"role": "assistant", "content": reply},
        )
        self.tracker.record(call)
        return call

    @torch.no_grad()
    def _logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        if self.model is None:
            return [-1.0] * len(completion)
        ids = torch.tensor([prompt + completion])
        logp = torch.log_softmax(self.model(ids).logits[0].float(), -1)
        n = len(prompt)
        exact = [float(logp[n - 1 + i, t]) for i, t in enumerate(completion)]
        # Off-policy by a little, so PPO ratios differ from 1 and some clip.
        return [lp + 0.3 * ((7 * i) % 5 - 2) / 2 for i, lp in enumerate(exact)]


SYS = {"role": "system", "content": "You are a math agent. Use the calculator tool."}


def user(text):
    return {"role": "user", "content": text}


def asst(text):
    return {"role": "assistant", "content": text}


def tool(text):
    return {"role": "tool", "content": text}


def react(d: Driver, question: str, turns: int = 3, tag: str = "") -> list[LLMCall]:
    messages, calls = [SYS, user(question)], []
    for i in range(turns):
        # GRPO siblings (different tags) agree on the first step, then diverge.
        reply = f"Step {i}: I will compute {i} + {question[-2:]} with the tool." + (
            tag if i else ""
        )
        calls.append(d.call("default", messages, reply))
        messages = messages + [asst(reply), tool(f"result {i * 7}")]
    return calls


def test_real_template_is_prefix_preserving_and_extension_equals_retokenization(renderer):
    assert check_prefix_preserving(renderer)
    d = Driver(renderer)
    calls = react(d, "What is 12 * 12?")
    assert [c.timeline_id for c in calls] == [0, 0, 0]
    for c in calls:
        assert c.prompt_ids == renderer.encode(renderer.render(c.messages))
    # A completion cut by length: the bridge carries <|im_end|> as untrained context.
    cut = d.call(
        "default",
        calls[-1].messages + [asst(calls[-1].response_message["content"]), tool("144")],
        "The answer is",
        eos=False,
    )
    nxt = d.call("default", cut.messages + [asst("The answer is"), user("Finish.")], "144.")
    assert nxt.fork_cause == "" and nxt.timeline_id == 0
    assert nxt.prompt_ids == renderer.encode(renderer.render(nxt.messages))
    (tl,) = d.tracker.timelines()
    eos_at = len(cut.prompt_ids) + len(cut.completion_ids)
    assert tl.token_ids[eos_at] in renderer.eos_token_ids and not tl.trainable[eos_at]


def test_sampled_non_canonical_tokens_are_kept(renderer):
    d = Driver(renderer)
    text = "Hello there"
    canonical = renderer.encode(text)
    # The same text as one token per character: what a sampler may produce.
    odd = [t for ch in text for t in renderer.encode(ch)]
    assert odd != canonical
    first = d.call("default", [SYS, user("Greet me.")], text, completion_ids=odd)
    second = d.call("default", [SYS, user("Greet me."), asst(text), user("Again.")], "Hi.")
    assert second.fork_cause == ""
    n = len(first.prompt_ids)
    assert second.prompt_ids[n : n + len(odd)] == odd  # never re-tokenized
    assert second.prompt_ids != renderer.encode(renderer.render(second.messages))


def build_batch(renderer, model, small: bool = False):
    """GRPO group of two ReAct episodes, a retry episode and a two-agent episode; `small`: the
    ReAct episodes of two turns and the retry (a merged multi-turn sample and a fork), for the
    bundled model, whose per-call reference is most of that test's time."""
    per_call, merged = [], []

    def finish(d: Driver, eid: str, adv: float):
        pc = per_call_samples(d.tracker.calls, episode_id=eid, group_id="g", reward=0.0)
        mg = timelines_to_samples(
            merge_timelines(d.tracker.timelines()), episode_id=eid, group_id="g", reward=0.0
        )
        for s in pc + mg:
            s.advantage = [adv] * len(s.input_ids)
        per_call.extend(pc)
        merged.extend(mg)

    for e, adv in enumerate((1.0, -0.5)):
        d = Driver(renderer, model)
        react(d, "What is 17 + 25?", turns=2 if small else 3, tag=f" Plan {e}.")
        finish(d, f"react{e}", adv)
    d = Driver(renderer, model)
    d.call("default", [SYS, user("Add 2 and 3.")], "Let me call the tool.")
    h = [SYS, user("Add 2 and 3."), asst("Let me call the tool."), tool("5")]
    d.call("default", h, "It is 5.")
    d.call("default", h, "The sum is five.")  # a retry from the same state
    finish(d, "retry", 0.7)
    if small:
        return per_call, merged
    d = Driver(renderer, model, roles={"alice"})
    a, b = [SYS, user("Debate: is 7 prime?")], [SYS, user("Judge the debate.")]
    for i in range(2):
        d.call("alice", a, f"Yes, argument {i}.")
        a = a + [asst(f"Yes, argument {i}."), user(f"Judge: noted {i}.")]
        d.call("judge", b, f"Noted {i}.")
        b = b + [asst(f"Noted {i}."), user(f"Alice: Yes, argument {i}.")]
    finish(d, "agents", 0.3)
    return per_call, merged


def per_call_loss(model, samples, weights):
    """The reference: one sequence per call, as a right-padded batch with an attention mask. The
    vocabulary projection runs on the positions that predict a trained token only (over every
    position it took most of the bundled test's time: 783 x 49,152 logits)."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.tensor([s.input_ids + [0] * (width - len(s.input_ids)) for s in samples])
    mask = torch.tensor([[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in samples])
    hidden = model.model(ids, attention_mask=mask).last_hidden_state
    loss = torch.zeros(())
    for row, (s, w) in enumerate(zip(samples, weights, strict=True)):
        idx = [t for t, m in enumerate(s.loss_mask) if m]
        logp = torch.log_softmax(model.lm_head(hidden[row, [t - 1 for t in idx]]).float(), -1)
        new = logp[range(len(idx)), [s.input_ids[t] for t in idx]]
        part, _ = policy_loss(
            new,
            torch.tensor([s.old_logprobs[t] for t in idx]),
            torch.tensor([s.advantage[t] for t in idx]),
            torch.tensor([w[t] for t in idx]),
            clip_low=0.2,
            clip_high=0.2,
        )
        loss = loss + part
    return loss


def packed_loss(model, packed):
    loss = torch.zeros(())
    for seq in packed:
        new, _ = forward_packed(model, seq)
        part, _ = policy_loss(
            new,
            torch.tensor(seq.entry_old_logprob),
            torch.tensor(seq.entry_advantage),
            torch.tensor(seq.entry_weight),
            clip_low=0.2,
            clip_high=0.2,
        )
        loss = loss + part
    return loss


def grads(model, loss_fn) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return float(loss.detach()), flat


@pytest.mark.parametrize("mode", list(LossAgg))
def test_loss_and_gradient_equal_one_sample_per_call(renderer, tiny_model, mode):
    per_call, merged = build_batch(renderer, tiny_model)
    packed = pack_samples(merged, loss_weights(merged, mode), 100_000)
    stats = pack_stats(merged, packed)
    assert (
        stats["tokens_packed"]
        == stats["tokens_distinct"]
        < stats["tokens_merged"]
        < stats["tokens_per_call"]
    )
    assert stats["tokens_per_call"] == sum(len(s.input_ids) for s in per_call)
    w_call = loss_weights(per_call, mode)
    ref_loss, ref_grad = grads(tiny_model, lambda: per_call_loss(tiny_model, per_call, w_call))
    got_loss, got_grad = grads(tiny_model, lambda: packed_loss(tiny_model, packed))
    assert ref_grad.norm() > 0
    assert abs(got_loss - ref_loss) <= 1e-4 * abs(ref_loss)
    assert float((got_grad - ref_grad).norm() / ref_grad.norm()) <= 1e-4
    # Micro-batches (several packed sequences) sum to the same gradient.
    small = pack_samples(merged, loss_weights(merged, mode), 120)
    assert len(small) > 1
    _, split_grad = grads(tiny_model, lambda: packed_loss(tiny_model, small))
    assert float((split_grad - ref_grad).norm() / ref_grad.norm()) <= 1e-4


@pytest.mark.parametrize("which", ["tiny", "bundled"])
def test_packed_logits_equal_separate_forwards(renderer, tiny_model, bundled_model_dir, which):
    from transformers import AutoModelForCausalLM

    model = (
        tiny_model
        if which == "tiny"
        else AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32).eval()
    )
    per_call, merged = build_batch(renderer, None)
    (packed,) = pack_samples(merged, loss_weights(merged, LossAgg.token_mean), 100_000)
    with torch.no_grad():
        got, _ = forward_packed(model, packed)
        expected = []
        for s in merged:
            logp = torch.log_softmax(model(torch.tensor([s.input_ids])).logits[0].float(), -1)
            expected += [float(logp[t - 1, s.input_ids[t]]) for t, m in enumerate(s.loss_mask) if m]
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-4, rtol=0)


def test_loss_and_gradient_equal_on_the_bundled_model(renderer, bundled_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32).eval()
    per_call, merged = build_batch(renderer, model, small=True)
    assert len(merged) < len(per_call)  # calls were merged
    packed = pack_samples(merged, loss_weights(merged, LossAgg.token_mean), 100_000)
    w_call = loss_weights(per_call, LossAgg.token_mean)
    ref_loss, ref_grad = grads(model, lambda: per_call_loss(model, per_call, w_call))
    got_loss, got_grad = grads(model, lambda: packed_loss(model, packed))
    assert abs(got_loss - ref_loss) <= 1e-4 * abs(ref_loss)
    assert float((got_grad - ref_grad).norm() / ref_grad.norm()) <= 1e-4


def test_with_the_engine_chat_format_and_tool_calls(bundled_model_dir):
    from transformers import AutoTokenizer

    fmt = ChatFormat(AutoTokenizer.from_pretrained(bundled_model_dir))
    assert check_prefix_preserving(fmt)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "description": "evaluate an expression",
                "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
            },
        }
    ]
    tracker = ContextTracker(fmt, None, ContextConfig())
    eos = next(iter(fmt.eos_token_ids))
    messages = [SYS, user("What is 6*7?")]
    calls = []
    for text in (
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "6*7"}}\n</tool_call>',
        "It is 42.",
    ):
        prompt = tracker.build_prompt("default", messages, tools)
        ids = fmt.encode(text) + [eos]
        reply = fmt.to_openai_message(fmt.parse_completion(text))
        call = LLMCall(
            role="default",
            prompt_ids=prompt,
            completion_ids=ids,
            completion_logprobs=[-1.0] * len(ids),
            finish_reason="stop",
            policy_version=0,
            messages=[dict(m) for m in messages],
            tools=tools,
            response_message=reply,
        )
        tracker.record(call)
        calls.append(call)
        if reply.get("tool_calls"):
            # The agent echoes the parsed reply back (arguments as a JSON string) + the result.
            tool_id = reply["tool_calls"][0]["id"]
            messages = messages + [
                reply,
                {"role": "tool", "tool_call_id": tool_id, "content": "42"},
            ]
    assert calls[0].response_message["tool_calls"]
    assert calls[1].fork_cause == "" and calls[1].timeline_id == 0
    assert calls[1].prompt_ids == fmt.encode(fmt.render(calls[1].messages, tools))
