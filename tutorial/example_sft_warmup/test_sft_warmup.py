"""The SFT warm-up tutorial: its data regenerates identically, every dialog trains the right
tokens under the real chat template, and `ajet sft` + `ajet eval` run on its YAML."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.cli import ajet as fork_ajet

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def test_data_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    import make_data

    assert make_data.main(tmp_path).read_text() == (HERE / "dialogs.jsonl").read_text()


def test_dialogs_never_contain_an_eval_question() -> None:
    dialogs = [json.loads(line) for line in (HERE / "dialogs.jsonl").read_text().splitlines()]
    assert Counter(d["task_type"] for d in dialogs) == {"adder": 57, "adder_multi": 16, "math_tool": 48}
    val = {json.loads(line)["question"] for line in
           (REPO / "tutorial/example_function_workflow/val.jsonl").read_text().splitlines()}
    asked = {m["content"] for d in dialogs for m in d["messages"] if m["role"] == "user"}
    assert not asked & val


def test_trained_tokens_are_the_replies(bundled_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from ajet.engine.chat import ChatFormat
    from ajet.sft.data import read_dialogs
    from ajet.sft.masks import dialog_samples

    chat = ChatFormat(AutoTokenizer.from_pretrained(bundled_model_dir))
    for dialog in read_dialogs(HERE / "dialogs.jsonl"):
        (sample,) = dialog_samples(dialog, chat)
        trained = [chat.decode(sample.input_ids[a:b]) for a, b in sample.segments]
        replies = [m for m in dialog.messages if m["role"] == "assistant"]
        assert len(trained) == len(replies)
        for text, reply in zip(trained, replies, strict=True):
            assert text.endswith("<|im_end|>")
            if reply.get("tool_calls"):
                assert text.startswith("<tool_call>\n") and '"name": "calculate"' in text
            else:
                assert text == reply["content"] + "<|im_end|>"


@pytest.mark.tutorial
@pytest.mark.integration
def test_sft_then_eval_on_the_tiny_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    common = [f"model.path={tiny_model_dir}", f"project.exp_dir={tmp_path}", "logging.tensorboard=false"]
    sft = fork_ajet("sft", "--conf", str(HERE / "sft_warmup.yaml"), *common, "sft.epochs=1", "sft.batch_size=32",
                    timeout=600, cwd=REPO)
    assert sft.returncode == 0, sft.stderr[-4000:]
    run = tmp_path / "sft_warmup"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["split"] == "train" and r["step"] > 0]
    # 121 dialogs, 12 held out for dev; math_tool at weight 0.5: about 109 - 22 per epoch
    assert 80 <= sum(r["sft/dialogs"] for r in steps) <= 95
    assert any(r["split"] == "val" and "val/sft/loss" in r for r in rows)
    ev = fork_ajet("eval", "--conf", str(HERE / "sft_warmup.yaml"), *common, "--model", str(run / "final_model"),
                   "--n", "1", "eval.max_tasks=2", "rollout.max_tokens=4", timeout=600, cwd=REPO)
    assert ev.returncode == 0, ev.stderr[-4000:]
    report = json.loads((run / "eval" / "eval_sft_warmup-final_model.json").read_text())
    assert report["metrics"]["episodes"] == 2 and report["model"] == str(run / "final_model")
