"""The chat-template check of `--dry-run` and the run's start (`template_breaks`): for each
message shape (system prompt, text reply, tool call, tool result, reasoning), does extending the
earlier prompt by tokens give the tokens of the whole conversation? A break names the shape and
the first differing token."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_context_fakes import CharChatML, LatestMarkChatML

from ajet.context.diagnostics import SHAPES, template_breaks, template_report

# ChatML that keeps an assistant's reasoning only in its last turn, as Qwen3's template does.
DROPS_EARLIER_REASONING = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_prefix_preserving_template_has_no_break() -> None:
    assert template_breaks(CharChatML()) == []
    assert "prefix-preserving for system prompts" in template_report(CharChatML())


def test_a_template_that_rewrites_earlier_turns_names_each_shape() -> None:
    breaks = template_breaks(LatestMarkChatML())
    assert breaks and {b.shape for b in breaks} <= {shape for shape, *_ in SHAPES}
    report = template_report(LatestMarkChatML())
    assert "not prefix-preserving" in report and "context/fork/template_not_prefix_preserving" in report
    assert breaks[0].describe() in report


@pytest.fixture(scope="module")
def chat_format(bundled_model_dir: Path):
    from transformers import AutoTokenizer

    from ajet.engine.chat import ChatFormat

    return lambda template=None: ChatFormat(_with_template(AutoTokenizer.from_pretrained(bundled_model_dir), template))


def _with_template(tokenizer, template: str | None):  # noqa: ANN001, ANN202
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def test_the_bundled_template_keeps_every_shape(chat_format) -> None:
    assert template_breaks(chat_format()) == []


def test_dropping_earlier_reasoning_is_found_at_its_first_token(chat_format) -> None:
    chat = chat_format(DROPS_EARLIER_REASONING)
    breaks = template_breaks(chat)
    assert [b.shape for b in breaks] == ["a user turn after a reply with reasoning (<think>)"]
    found = breaks[0]
    # Right where the reply starts, the re-rendered conversation has the answer ("2 + 3 = 5.")
    # and the extended prompt the reply as generated ("<think>...").
    shape, history, _, _ = SHAPES[-1]
    from ajet.context.diagnostics import SHAPE_TOOLS

    reply_starts = len(chat.encode(chat.render(history, SHAPE_TOOLS, add_generation_prompt=True)))
    assert (found.position, found.template, found.extended) == (reply_starts, "2", "<")


def test_dry_run_names_the_break_of_the_models_template(bundled_model_dir: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import AutoTokenizer

    from ajet.cli.preflight import check_chat_template
    from ajet.config.loader import load_config

    model = tmp_path / "reasoning_model"
    model.mkdir()
    shutil.copy(bundled_model_dir / "config.json", model / "config.json")
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    tokenizer.chat_template = DROPS_EARLIER_REASONING
    tokenizer.save_pretrained(model)
    cache = f"model.cache_dir={tmp_path / 'cache'}"
    cfg = load_config(None, overrides=[f"model.path={model}", cache], require_workflow=False)
    line = check_chat_template(cfg)
    assert "not prefix-preserving for 1 of" in line
    assert "a user turn after a reply with reasoning (<think>): token" in line and "'2'" in line
    assert "is trained as its own sample" in line
    # kept per tokenizer: the next dry run reads it back without loading transformers
    assert [p.read_text() for p in (tmp_path / "cache" / "template_checks").iterdir()] == [line]
    assert check_chat_template(cfg) == line
    fine = check_chat_template(load_config(None, overrides=[f"model.path={bundled_model_dir}", cache],
                                           require_workflow=False))
    assert fine.startswith("chat template: prefix-preserving")
    missing = check_chat_template(load_config(None, overrides=[f"model.path={tmp_path / 'nothing'}", cache],
                                              require_workflow=False))
    assert "checked when the run starts" in missing


def test_the_check_is_logged_once_per_tokenizer_whoever_asks_first(caplog: pytest.LogCaptureFixture) -> None:
    """One check, not two: the run's start (`log_template_check`) and a tracker's first prompt
    (`inspect_template`) share `report_template`, which logs the first time only."""
    from test_context_fakes import make_tracker

    from ajet.context.diagnostics import CUT_SHAPE, report_template
    from ajet.rollout.engine_rollout import log_template_check

    assert CUT_SHAPE in {shape for shape, *_ in SHAPES}  # a reply cut at max_tokens is a shape too
    renderer = LatestMarkChatML()
    with caplog.at_level("INFO", logger="ajet.context.diagnostics"):
        log_template_check(renderer)
        tracker, agent = make_tracker(renderer=renderer)
        agent.call("default", [{"role": "user", "content": "hi"}], "a")
        assert report_template(renderer) == template_breaks(renderer)
    logged = [r for r in caplog.records if "chat template" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "WARNING"
    assert "not prefix-preserving for" in logged[0].getMessage()
