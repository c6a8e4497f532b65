"""SFT loss masks cover exactly the assistant turns, checked against the rendered text with
the real bundled tokenizer (ChatML: the reply and its <|im_end|>, nothing else)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ajet.sft.data import DialogDataError, dialog_from_row, read_dialogs, split_dev
from ajet.sft.masks import dialog_samples

CALC = {"type": "function", "function": {"name": "calculate", "description": "Evaluate.",
                                         "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def chat(bundled_model_dir: Path):
    from transformers import AutoTokenizer

    from ajet.engine.chat import ChatFormat

    return ChatFormat(AutoTokenizer.from_pretrained(bundled_model_dir))


def tool_dialog(**extra):
    call = {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "9 * 8"}'}}
    messages = [
        {"role": "system", "content": "You solve problems."},
        {"role": "user", "content": "Ken buys 9 boxes of 8 shells. How many?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "72"},
        {"role": "assistant", "content": "\\boxed{72}"},
        {"role": "user", "content": "And 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "thanks"},  # trailing context after the last reply
    ]
    return dialog_from_row({"messages": messages, "tools": [CALC], **extra}, "d0")


def expected_assistant_texts(text: str) -> list[str]:
    """Independently of the code under test: every assistant turn of a ChatML text, with its EOS."""
    return [m + "<|im_end|>" for m in re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, re.DOTALL)]


def test_mask_covers_exactly_the_assistant_turns(chat) -> None:
    dialog = tool_dialog()
    (sample,) = dialog_samples(dialog, chat)
    full = chat.render(dialog.messages, dialog.tools, add_generation_prompt=False)
    expected = expected_assistant_texts(full)
    assert len(expected) == 3 and "<tool_call>" in expected[0] and '"9 * 8"' in expected[0]

    # The sample is the rendered dialog up to the last reply's EOS, token for token.
    text = chat.decode(sample.input_ids)
    assert full.startswith(text) and text.endswith("4<|im_end|>")
    # Each maximal run of trained tokens decodes to exactly one assistant turn, in order.
    runs, start = [], None
    for i, m in enumerate(sample.loss_mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            runs.append((start, i))
            start = None
    assert [chat.decode(sample.input_ids[a:b]) for a, b in runs] == expected
    assert runs == sample.segments
    # Untrained tokens are everything else: system, user, tool turns and the template's framing.
    untrained = "".join(chat.decode([t]) for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m)
    assert "You solve problems." in untrained and "<tool_response>\n72" in untrained
    assert "\\boxed{72}" not in untrained and untrained.count("<|im_start|>assistant\n") == 3
    # Trained tokens know their assistant turn (for seq_mean loss weights).
    assert sorted({c for c, m in zip(sample.token_call_ids, sample.loss_mask, strict=True) if m}) == [0, 1, 2]
    assert all(c == -1 for c, m in zip(sample.token_call_ids, sample.loss_mask, strict=True) if not m)
    assert sample.old_logprobs == [0.0] * len(sample.input_ids)


def test_weight_zero_turn_stays_context(chat) -> None:
    dialog = tool_dialog()
    dialog.messages[4] = {**dialog.messages[4], "weight": 0}
    (sample,) = dialog_samples(dialog, chat)
    trained = [chat.decode(sample.input_ids[a:b]) for a, b in sample.segments]
    assert len(trained) == 2 and "\\boxed{72}" not in "".join(trained)
    assert "\\boxed{72}" in chat.decode(sample.input_ids)


def test_prompt_tokens_are_what_the_rollout_sends(chat) -> None:
    """The tokens before the first reply are exactly the encoded generation prompt."""
    dialog = tool_dialog()
    (sample,) = dialog_samples(dialog, chat)
    prompt = chat.encode(chat.render(dialog.messages[:2], dialog.tools, add_generation_prompt=True))
    first = sample.segments[0][0]
    assert sample.input_ids[:first] == prompt


class RewritingRenderer:
    """A template that drops earlier assistant replies (like reasoning-stripping templates)."""

    eos_token_ids = {0}

    def render(self, messages, tools=None, add_generation_prompt=True):
        last_user = max(i for i, m in enumerate(messages) if m["role"] != "assistant") if messages else -1
        parts = []
        for i, m in enumerate(messages):
            content = m.get("content") or ""
            if m["role"] == "assistant" and i < last_user:
                content = "..."
            parts.append(f"<{m['role']}>{content}<end>")
        return "".join(parts) + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text):  # one id per character; "<end>" is the EOS token 0
        return [t for piece in re.split("(<end>)", text) for t in ([0] if piece == "<end>" else map(ord, piece))]

    def decode(self, ids):
        return "".join("<end>" if i == 0 else chr(i) for i in ids)


def test_not_prefix_preserving_template_gives_one_sample_per_turn() -> None:
    renderer = RewritingRenderer()
    dialog = dialog_from_row({"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "x"},
        {"role": "user", "content": "b"}, {"role": "assistant", "content": "y"},
    ]}, "d")
    samples = dialog_samples(dialog, renderer)
    assert len(samples) == 2
    for sample, reply in zip(samples, ("x", "y"), strict=True):
        a, b = sample.segments[0]
        assert sum(sample.loss_mask) == b - a and b == len(sample.input_ids)
        assert renderer.decode(sample.input_ids[a:b]).startswith(reply)
    # the second turn's prompt is the rewritten history, as the model would see it
    assert "<assistant>...<end>" in renderer.decode(samples[1].input_ids)


def test_dialog_records_are_checked(tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "task_type": "t", "loss": 1.5, "target_tools": ["x"]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "id": "b"}) + "\n")
    dialogs = read_dialogs(path)
    assert [d.dialog_id for d in dialogs] == ["d-1", "b"] and dialogs[0].loss == 1.5
    for bad, message in (
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant message"),
        ({"messages": [{"role": "robot", "content": "q"}]}, "role"),
        ({**good, "loss": "high"}, "'loss' must be a number"),
        ({**good, "tools": "calc"}, "'tools'"),
    ):
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(DialogDataError, match=f"d.jsonl:2: malformed dialog: .*{re.escape(message)}"):
            read_dialogs(path)
    path.write_text(json.dumps({**good, "id": "x"}) + "\n" + json.dumps({**good, "id": "x"}) + "\n")
    with pytest.raises(DialogDataError, match="duplicate id 'x'"):
        read_dialogs(path)


def test_first_token_cannot_be_trained(chat) -> None:
    dialog = dialog_from_row({"messages": [{"role": "assistant", "content": "hi"}]}, "d")
    with pytest.raises(ValueError, match="first token"):
        dialog_samples(dialog, chat)


def test_split_dev_is_seeded_and_keeps_order() -> None:
    dialogs = [dialog_from_row({"messages": [{"role": "user", "content": str(i)}, {"role": "assistant", "content": "a"}]},
                               f"d{i}") for i in range(20)]
    train, dev = split_dev(dialogs, 0.2, seed=3)
    assert len(dev) == 4 and len(train) == 16
    assert split_dev(dialogs, 0.2, seed=3)[1] == dev
    assert [d.dialog_id for d in train] == sorted((d.dialog_id for d in train), key=lambda s: int(s[1:]))
    assert {d.dialog_id for d in train} | {d.dialog_id for d in dev} == {d.dialog_id for d in dialogs}
