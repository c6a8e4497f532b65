"""The bundled model converts once, reloads fast, and chats."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_bundled_model_generates_a_chat_reply(bundled_model_dir: Path) -> None:
    import torch

    from ajet.config.schema import ModelConfig
    from ajet.models.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(ModelConfig(device="cpu"))
    assert "quantization_config" not in model.config.to_dict()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    prompt = tokenizer.decode(inputs["input_ids"][0])
    assert prompt.endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in reply


def test_concurrent_first_conversion_is_safe(tmp_path: Path) -> None:
    """Two processes converting into an empty cache at once both get a complete checkpoint."""
    code = "from ajet.models.resolve import bundled_checkpoint; print(bundled_checkpoint())"
    env = {**os.environ, "AJET_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1
    ckpt = Path(paths.pop())
    assert (ckpt / ".complete").is_file() and (ckpt / "model.safetensors").is_file()
    leftovers = [p.name for p in ckpt.parent.iterdir() if p.name.startswith(".") and p.is_dir()]
    assert leftovers == []
