"""Fake chat renderers and an agent driver for the context tests (plus tests of the fakes).

`CharChatML` is a ChatML template over a character-level tokenizer: exact, canonical
and prefix-preserving, so a prompt built by extension must equal the tokens of the
full render. `LatestMarkChatML` marks the latest user turn, so it is not
prefix-preserving (earlier renders are not prefixes of later ones).
"""

from __future__ import annotations

import json
from typing import Any

from ajet.config.schema import ContextConfig
from ajet.context.diagnostics import check_prefix_preserving, probe_template
from ajet.context.tracker import ContextTracker
from ajet.context.types import LLMCall

IM_START, IM_END = 1, 2
_SPECIAL = {"<|im_start|>": IM_START, "<|im_end|>": IM_END}
_SPECIAL_TEXT = {v: k for k, v in _SPECIAL.items()}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return str(content)


def _tool_calls(message: dict) -> str:
    out = ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        out += (
            "<tool_call>"
            + json.dumps({"name": fn["name"], "arguments": args}, sort_keys=True)
            + "</tool_call>"
        )
    return out


class CharChatML:
    """ChatML; one token per character, <|im_start|>=1 and <|im_end|>=2 (EOS)."""

    eos_token_ids = {IM_END}

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        out = ""
        if tools:
            out += "<|im_start|>tools\n" + json.dumps(tools, sort_keys=True) + "<|im_end|>\n"
        for i, m in enumerate(messages):
            out += f"<|im_start|>{m['role']}\n{self._content(messages, i)}<|im_end|>\n"
        if add_generation_prompt:
            out += "<|im_start|>assistant\n"
        return out

    def _content(self, messages: list[dict], i: int) -> str:
        return _text(messages[i].get("content")) + _tool_calls(messages[i])

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for special, tok in _SPECIAL.items():
                if text.startswith(special, i):
                    ids.append(tok)
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]) + 10)
                i += 1
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return "".join(_SPECIAL_TEXT.get(t) or chr(t - 10) for t in token_ids)


class LatestMarkChatML(CharChatML):
    """Renders the latest user message with a marker: history changes when a turn is added."""

    def _content(self, messages: list[dict], i: int) -> str:
        last_user = max((j for j, m in enumerate(messages) if m["role"] == "user"), default=-1)
        text = super()._content(messages, i)
        return text + " (latest)" if i == last_user else text


def logprobs_for(n: int, seed: float = 0.0) -> list[float]:
    return [-(0.01 * (i + 1) + seed) for i in range(n)]


class Agent:
    """Drives a tracker like the tuner does: build the prompt, 'generate', record."""

    def __init__(self, tracker: ContextTracker, renderer: CharChatML) -> None:
        self.tracker = tracker
        self.renderer = renderer

    def call(
        self,
        role: str,
        messages: list[dict],
        reply: str,
        *,
        tools: list[dict] | None = None,
        eos: bool = True,
        completion_text: str | None = None,
        response: dict | None = None,
    ) -> LLMCall:
        prompt = self.tracker.build_prompt(role, messages, tools)
        completion = self.renderer.encode(completion_text if completion_text is not None else reply)
        completion += [IM_END] if eos else []
        call = LLMCall(
            role=role,
            prompt_ids=prompt,
            completion_ids=completion,
            completion_logprobs=logprobs_for(len(completion), seed=len(self.tracker.calls)),
            finish_reason="stop" if eos else "length",
            policy_version=0,
            messages=[dict(m) for m in messages],
            tools=tools,
            response_message=response
            if response is not None
            else {"role": "assistant", "content": reply},
        )
        self.tracker.record(call)
        return call


def make_tracker(
    renderer: CharChatML | None = None, roles: set[str] | None = None
) -> tuple[ContextTracker, Agent]:
    renderer = renderer or CharChatML()
    tracker = ContextTracker(renderer, roles, ContextConfig())
    return tracker, Agent(tracker, renderer)


def test_char_chatml_round_trips_and_is_prefix_preserving():
    r = CharChatML()
    text = r.render([{"role": "user", "content": "hé"}])
    assert r.decode(r.encode(text)) == text
    assert r.encode("<|im_end|>") == [IM_END]
    assert check_prefix_preserving(r)
    probe = probe_template(r)
    assert (probe.turn_end, probe.eos_text, probe.post_eos) == ("<|im_end|>\n", "<|im_end|>", "\n")


def test_latest_mark_template_is_detected_as_not_prefix_preserving():
    assert not check_prefix_preserving(LatestMarkChatML())
