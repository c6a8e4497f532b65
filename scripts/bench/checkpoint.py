"""What one checkpoint costs (`trainer.save_every_minutes` writes one every 10 minutes by
default): the seconds `save_checkpoint` takes and the bytes it writes, for the bundled model
trained in full (fp32 weights and AdamW state) and with LoRA, after one optimizer step.

    .venv/bin/python -m scripts.bench.checkpoint [--repeats 3] [--model smollm2-135m-instruct]

Prints a table; the checkpoints go to a temp dir that is removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.common import markdown_table


def one_step(model, optimizer) -> None:  # noqa: ANN001 - torch objects
    """One optimizer step, so that the optimizer state exists as in a run."""
    import torch

    ids = torch.randint(0, 1000, (1, 32))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


def measure(model_name: str, lora: bool, repeats: int) -> tuple[list[float], int]:
    from ajet.config.schema import LoraConfig, ModelConfig, TrainerConfig
    from ajet.training.checkpoint import save_checkpoint
    from ajet.training.model import load_trainable_model
    from ajet.training.optim import build_optimizer

    model, _ = load_trainable_model(ModelConfig(path=model_name, lora=LoraConfig(enabled=lora)), seed=0)
    optimizer, scheduler = build_optimizer(model, TrainerConfig(), seed=0)
    one_step(model, optimizer)
    root = Path(tempfile.mkdtemp(prefix="ajet-bench-ckpt-"))
    try:
        seconds = []
        for step in range(1, repeats + 1):
            start = time.perf_counter()
            path = save_checkpoint(root, step, model=model, optimizer=optimizer, scheduler=scheduler,
                                   extra={"reader": {"position": step}}, keep_last=2)
            seconds.append(time.perf_counter() - start)
        size = sum(f.stat().st_size for f in path.iterdir())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return seconds, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    rows = []
    for lora in (False, True):
        seconds, size = measure(args.model, lora, args.repeats)
        median = statistics.median(seconds)
        rows.append(["LoRA r=8" if lora else "full fp32", f"{size / 1e6:.0f} MB",
                     f"{median:.2f} ({min(seconds):.2f}-{max(seconds):.2f})", f"{median / 600:.2%}"])
    print(*markdown_table(["training", "checkpoint size", "seconds (median, min-max)", "share of 10 minutes"],
                          rows, right={1, 2, 3}), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
