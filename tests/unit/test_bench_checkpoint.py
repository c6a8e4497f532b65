"""scripts/bench/checkpoint.py on the tiny model: it writes whole checkpoints (weights,
optimizer state after a step) and reports their size and time."""

from __future__ import annotations

from pathlib import Path


def test_it_measures_a_whole_checkpoint(script, tiny_model_dir: Path) -> None:
    bench = script("bench.checkpoint")
    seconds, size = bench.measure(str(tiny_model_dir), lora=False, repeats=2)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    weights = sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors"))
    assert size > 2 * weights  # the weights, and AdamW's two moments of the same size
    _, lora_size = bench.measure(str(tiny_model_dir), lora=True, repeats=1)
    assert lora_size < size  # only the adapters and their state
