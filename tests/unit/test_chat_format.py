"""ChatFormat: rendering (normalisation, hermes tools, prefix preservation) and reply parsing."""

from __future__ import annotations

import copy
import itertools
import json
import logging

import pytest

from ajet.engine import chat as chat_module
from ajet.engine.chat import ChatFormat, ParsedReply, parse_completion, to_openai_message

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}

CONVERSATION = [
    {"role": "system", "content": "You are a calculator."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+3?"}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    {"role": "assistant", "content": "2+3 = 5."},
    {"role": "user", "content": "And 4+4?"},
]


@pytest.fixture(scope="module")
def tokenizer(bundled_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model_dir)


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatFormat(tokenizer)


def test_plain_messages_render_like_the_template(chat, tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    assert chat.render(messages) == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert chat.render(messages).endswith("<|im_start|>assistant\n")
    assert not chat.render(messages, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n"
    )


def test_bundled_template_is_detected_as_not_using_tools(chat):
    assert chat.native_tools is False
    assert chat.eos_token_ids == {2}


def test_content_none_and_text_blocks_are_normalised(chat):
    text = chat.render(CONVERSATION[:3], add_generation_prompt=False)
    assert "What is\n2+3?" in text
    assert "None" not in text
    with pytest.raises(ValueError, match="image_url"):
        chat.render(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        )


def test_tool_calls_and_results_render_hermes_style(chat):
    text = chat.render(CONVERSATION[:4], add_generation_prompt=False)
    call = '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    assert call in text
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>" in text
    assert "<|im_start|>tool" not in text


def test_tools_go_into_the_system_prompt(chat):
    with_system = chat.render(CONVERSATION[:2], tools=[ADD_TOOL])
    assert with_system.startswith("<|im_start|>system\nYou are a calculator.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(ADD_TOOL) + "\n</tools>" in with_system
    assert with_system.count("<|im_start|>system") == 1
    without_system = chat.render(CONVERSATION[1:2], tools=[ADD_TOOL])
    assert without_system.startswith("<|im_start|>system\n# Tools\n")
    assert "SmolLM" not in without_system  # our system turn replaces the template's default one
    # No tools: no tools block.
    assert "<tools>" not in chat.render(CONVERSATION[:2])


@pytest.mark.parametrize("tools", [None, [ADD_TOOL]])
@pytest.mark.parametrize("start", [0, 1])  # with and without a system message
def test_rendering_is_prefix_preserving_and_deterministic(chat, tools, start):
    messages = CONVERSATION[start:]
    for k in range(1, len(messages)):
        shorter = chat.render(messages[:k], tools=tools, add_generation_prompt=False)
        longer = chat.render(messages[: k + 1], tools=tools, add_generation_prompt=False)
        assert longer.startswith(shorter) and len(longer) > len(shorter)
    assert chat.render(messages, tools) == chat.render(
        copy.deepcopy(messages), copy.deepcopy(tools)
    )


def test_empty_conversation_is_a_clear_error(chat):
    with pytest.raises(ValueError, match="empty"):
        chat.render([])


def test_render_does_not_mutate_messages(chat):
    messages = copy.deepcopy(CONVERSATION)
    chat.render(messages, tools=[ADD_TOOL])
    assert messages == CONVERSATION


def test_encode_decode_round_trip_without_added_specials(chat, tokenizer):
    text = chat.render(CONVERSATION, tools=[ADD_TOOL])
    ids = chat.encode(text)
    assert chat.decode(ids) == text
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == text.count("<|im_start|>")
    assert chat.encode("hello") == tokenizer.encode("hello", add_special_tokens=False)


def test_native_tool_template_gets_tools_and_calls_passed_through(tokenizer):
    native = copy.deepcopy(tokenizer)
    native.chat_template = (
        "{% if tools %}TOOLS:{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}\n{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}"
        "</{{ m.role }}>\n{% endfor %}"
    )
    chat = ChatFormat(native)
    assert chat.native_tools is True
    text = chat.render(CONVERSATION[1:4], tools=[ADD_TOOL], add_generation_prompt=False)
    assert text.startswith("TOOLS:add\n")
    assert '[call add {"a": 2, "b": 3}]' in text  # arguments as a dict, not a JSON string
    assert "<tool>5</tool>" in text


def test_tokenizer_without_template_is_rejected(tokenizer):
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        ChatFormat(bare)


# ---------------------------------------------------------------------- parsing
def test_plain_reply_has_no_tool_calls():
    parsed = parse_completion("The answer is 5.")
    assert parsed == ParsedReply(
        content="The answer is 5.", tool_calls=[], malformed_tool_call=False
    )
    assert to_openai_message(parsed) == {"role": "assistant", "content": "The answer is 5."}


def test_tool_calls_are_parsed_in_openai_format():
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>{"name": "mul", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    parsed = parse_completion(text)
    assert parsed.content == "Let me compute."
    assert not parsed.malformed_tool_call
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["add", "mul"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert json.loads(parsed.tool_calls[1]["function"]["arguments"]) == {"x": 1}
    ids = [c["id"] for c in parsed.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    assert all(c["type"] == "function" for c in parsed.tool_calls)


def test_only_tool_calls_gives_content_none():
    parsed = parse_completion('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>')
    message = to_openai_message(parsed)
    assert message["content"] is None and message["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {"a": 1}}</tool_call>',
        '<tool_call>["add"]</tool_call>',
        '<tool_call>{"name": "add", "arguments": 3}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 1}}',  # never closed
    ],
)
def test_malformed_tool_call_stays_in_content(block):
    text = f"Trying.\n{block}"
    parsed = parse_completion(text)
    assert parsed.malformed_tool_call is True
    assert parsed.tool_calls == []
    assert parsed.content == text
    assert "tool_calls" not in to_openai_message(parsed)


def test_malformed_tool_calls_log_one_warning_then_debug(caplog, monkeypatch):
    """They are counted in agent/valid_tool_call_rate: one WARNING per process says so, each
    one is logged at DEBUG level."""
    monkeypatch.setattr(chat_module, "_malformed_seen", itertools.count())  # a fresh process
    with caplog.at_level(logging.DEBUG, logger="ajet.engine.chat"):
        for block in ("<tool_call>{not json}</tool_call>", "<tool_call>[1]</tool_call>", "<tool_call>{"):
            assert parse_completion(f"Trying.\n{block}").malformed_tool_call
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    debugs = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(warnings) == 1 and "agent/valid_tool_call_rate" in warnings[0].getMessage()
    assert "{not json}" in warnings[0].getMessage()
    assert len(debugs) == 3 and "unclosed <tool_call>" in debugs[2].getMessage()


def test_malformed_next_to_valid_call_keeps_the_valid_one():
    text = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> <tool_call>{oops}</tool_call>'
    parsed = parse_completion(text)
    assert parsed.malformed_tool_call and len(parsed.tool_calls) == 1
    assert parsed.content == "<tool_call>{oops}</tool_call>"


def test_parsed_reply_renders_back_to_the_generated_text(chat):
    """A canonical hermes reply, parsed and re-rendered as history, gives the same text —
    what lets the tracker extend a timeline after a tool call."""
    reply = 'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    message = chat.to_openai_message(chat.parse_completion(reply))
    history = [{"role": "user", "content": "2+3?"}]
    prompt = chat.render(history)
    full = chat.render(history + [message], add_generation_prompt=False)
    assert full == prompt + reply + "<|im_end|>\n"
