"""Shared fixtures: the bundled model and a tiny random model with the same tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests run with the library's defaults but never touch the user's real cache.
os.environ.setdefault("AJET_CACHE_DIR", str(Path.home() / ".cache" / "ajet"))

# A workflow that imports and loads (what --dry-run checks).
STUB_WORKFLOW = "from ajet import Workflow\n\n\nclass W(Workflow):\n    async def execute(self, task, tuner): ...\n"


@pytest.fixture(scope="session")
def bundled_model_dir() -> Path:
    """The converted bundled SmolLM2-135M-Instruct checkpoint (converted once, cached)."""
    from ajet.models.resolve import bundled_checkpoint

    return bundled_checkpoint()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path) -> Path:
    """A 2-layer random Llama with the bundled tokenizer and chat template (fast, deterministic)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny_model")
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


TWO_CALLS = '''
from ajet import Workflow, WorkflowOutput


class TwoCalls(Workflow):
    async def execute(self, task, tuner):
        messages = [{"role": "user", "content": task.main_query}]
        first = await tuner(messages)
        text = "".join(b.get("text", "") for b in first.content if b.get("type") == "text")
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}]
        await tuner(messages)
        return WorkflowOutput(reward=0.25, log_metrics={"turns": 2})
'''


@pytest.fixture()
def two_calls_conf(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A run YAML in tmp_path: the tiny model, three tasks, and a workflow that makes two chat
    calls (the second extends the first, after an untrained user turn) for reward 0.25."""
    import json

    (tmp_path / "agent.py").write_text(TWO_CALLS)
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "question": f"Count to {i + 2}."}) + "\n" for i in range(3)))
    conf = tmp_path / "run.yaml"
    conf.write_text(f"model: {{path: {tiny_model_dir}}}\nworkflow: {{target: agent.py:TwoCalls}}\n"
                    "task_reader: {jsonl: {train_path: train.jsonl}}\nrollout: {max_tokens: 6, n: 2}\n")
    return conf


@pytest.fixture()
def stub_run_conf(tmp_path: Path):
    """`stub_run_conf(body="")` writes tmp_path/run.yaml whose model, workflow and data only
    exist (enough for --dry-run, the backbone checks and the drivers' `prepare`); `body` adds
    YAML lines. Returns its path."""

    def write(body: str = "") -> Path:
        model = tmp_path / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text("{}")
        (tmp_path / "agent.py").write_text(STUB_WORKFLOW)  # --dry-run imports it
        (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
        path = tmp_path / "run.yaml"
        path.write_text(f"model: {{path: {model}}}\nworkflow: {{target: agent.py:W}}\n"
                        f"task_reader: {{jsonl: {{train_path: train.jsonl}}}}\n" + body)
        return path

    return write
