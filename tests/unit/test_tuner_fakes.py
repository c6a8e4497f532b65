"""Small fakes for the tuner/gateway tests: a char-level ChatML format, a tracker and a
scripted engine. They follow the APIs of `ajet.engine.chat.ChatFormat`,
`ajet.context.tracker.ContextTracker` and `ajet.engine.base.InferenceEngine` closely
enough that the tuner code cannot tell, and they record what they were given.

(Also a test module: the last tests check the fakes themselves.)
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ajet.config.schema import ContextConfig, RolloutConfig
from ajet.context.types import LLMCall
from ajet.engine.base import Completion, EngineFeatures, SamplingParams

SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}
EOS = 2
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class Parsed:
    content: str
    tool_calls: list[dict]
    malformed_tool_call: bool
    repaired: list[str] = field(default_factory=list)


class FakeChat:
    """ChatML with hermes-style tool calls; one token per character."""

    eos_token_ids = {EOS}
    max_token_chars = max(len(tok) for tok in SPECIALS)
    vocab_size = 0x110000 + 10  # a character's id is its code point + 10

    def __init__(self) -> None:
        self._ids = 0
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for tok, tid in SPECIALS.items():
                if text.startswith(tok, i):
                    ids.append(tid)
                    i += len(tok)
                    break
            else:
                ids.append(ord(text[i]) + 10)
                i += 1
        return ids

    def decode(self, ids: list[int]) -> str:
        back = {v: k for k, v in SPECIALS.items()}
        return "".join(back.get(i, chr(i - 10) if i >= 10 else "") for i in ids)

    def _content(self, m: dict) -> str:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content)
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            args = (
                json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
            )
            content += (
                "<tool_call>\n"
                + json.dumps({"name": fn["name"], "arguments": args})
                + "\n</tool_call>"
            )
        return content

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        out = ""
        if tools:
            out += "<|im_start|>system\n<tools>" + json.dumps(tools) + "</tools><|im_end|>\n"
        for m in messages:
            role = "user" if m["role"] == "tool" else m["role"]
            body = self._content(m)
            if m["role"] == "tool":
                body = f"<tool_response>{body}</tool_response>"
            out += f"<|im_start|>{role}\n{body}<|im_end|>\n"
        if add_generation_prompt:
            out += "<|im_start|>assistant\n"
        return out

    def parse_completion(self, text: str) -> Parsed:
        calls, malformed = [], False
        for match in _TOOL_CALL.finditer(text):
            try:
                obj = json.loads(match.group(1))
                name, args = obj["name"], obj.get("arguments", {})
            except (json.JSONDecodeError, KeyError, TypeError):
                malformed = True
                continue
            with self._lock:
                self._ids += 1
                call_id = f"call_{self._ids}"
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            )
        malformed = malformed or "<tool_call>" in _TOOL_CALL.sub("", text)  # unclosed, as the real parser
        content = text if malformed else _TOOL_CALL.sub("", text).strip()
        return Parsed(content, calls, malformed)

    def to_openai_message(self, parsed: Parsed) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
        if parsed.tool_calls:
            msg["tool_calls"] = parsed.tool_calls
        return msg


class FakeTracker:
    """Re-renders every prompt (no extension logic) and keeps the calls."""

    def __init__(self, chat: FakeChat) -> None:
        self.chat = chat
        self.calls: list[LLMCall] = []
        self.built: list[tuple[str, list[dict], list[dict] | None]] = []
        self._lock = threading.Lock()

    def build_prompt(
        self, role: str, messages: list[dict], tools: list[dict] | None, reply_prefix: str = ""
    ) -> list[int]:
        with self._lock:
            self.built.append((role, messages, tools))
        return self.chat.encode(self.chat.render(messages, tools) + reply_prefix)

    def record(self, call: LLMCall) -> None:
        with self._lock:
            call.call_index = len(self.calls)
            self.calls.append(call)


@dataclass
class FakeEngine(EngineFeatures):
    """Replies with scripted texts (a list consumed in order, or a function of the
    prompt text); greedy-like: same prompt → same reply. Thread/loop-safe."""

    chat: FakeChat
    script: list[str] | Callable[[str], str] = field(default_factory=list)
    policy_version: int = 3
    delay_s: float = 0.0
    seen: list[tuple[list[int], SamplingParams]] = field(default_factory=list)
    fail_with: Exception | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise self.fail_with
        with self._lock:
            self.seen.append((list(prompt_ids), params))
            if callable(self.script):
                text = self.script(self.chat.decode(prompt_ids))
            else:
                text = self.script.pop(0)
        ids = self.chat.encode(text) + [EOS]
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
        return [Completion(ids, logprobs, finish, self.policy_version, text=self.chat.decode(ids))]

    def bump_version(self) -> int:
        self.policy_version += 1
        return self.policy_version

    def load_state_dict(self, state_dict: dict) -> int:
        return self.bump_version()


class StreamingFakeEngine(FakeEngine):
    """FakeEngine that also streams: `on_token` gets each token id, one loop turn apart."""

    supports_streaming = True

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       on_token: Callable[[int], None] | None = None) -> list[Completion]:
        [completion] = await super().generate(prompt_ids, params)
        for token_id in completion.token_ids if on_token is not None else []:
            on_token(token_id)
            await asyncio.sleep(0.001)
        return [completion]


def make_session(
    script: list[str] | Callable[[str], str] = (),
    *,
    episode_id: str = "t0-e0",
    trainable_targets: set[str] | None = None,
    rollout: RolloutConfig | None = None,
    context: ContextConfig | None = None,
    model_max_len: int = 4096,
    delay_s: float = 0.0,
    streaming: bool = False,
):
    from ajet.tuner import EpisodeSession

    chat = FakeChat()
    engine_cls = StreamingFakeEngine if streaming else FakeEngine
    engine = engine_cls(chat, script if callable(script) else list(script), delay_s=delay_s)
    tracker = FakeTracker(chat)
    session = EpisodeSession(
        episode_id,
        engine,
        chat,
        tracker,
        rollout or RolloutConfig(temperature=0.7, top_p=0.9, top_k=5, max_tokens=200),
        context or ContextConfig(),
        trainable_targets,
        model_max_len,
    )
    return session, engine, tracker, chat


# -- the fakes themselves ---------------------------------------------------------


def test_fake_chat_roundtrip_and_tool_parse() -> None:
    chat = FakeChat()
    text = chat.render([{"role": "user", "content": "hi"}])
    assert chat.decode(chat.encode(text)) == text
    assert chat.encode("<|im_end|>") == [EOS]
    parsed = chat.parse_completion(
        'ok<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert parsed.content == "ok" and parsed.tool_calls[0]["function"]["name"] == "f"
    assert chat.parse_completion("<tool_call>{bad</tool_call>").malformed_tool_call


def test_fake_engine_caps_length() -> None:
    chat = FakeChat()
    engine = FakeEngine(chat, ["abcdef"])
    (c,) = asyncio.run(engine.generate([1], SamplingParams(max_tokens=3)))
    assert c.token_ids == chat.encode("abc") and c.finish_reason == "length"
