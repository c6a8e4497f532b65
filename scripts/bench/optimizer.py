"""One AdamW step over the bundled model's parameters: ajet's optimizer (`build_optimizer`,
torch's fused AdamW) against torch's default per-parameter loop and its `foreach` path.

Every update of every recipe ends in this step (8 SFT and 4 GRPO updates in `make demo`).
The gradients are random; the weights are the bundled SmolLM2-135M's, fp32.

    python -m scripts.bench.optimizer [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ajet.config.schema import TrainerConfig
from ajet.models.resolve import resolve_model_path
from ajet.training.optim import build_optimizer
from scripts.bench.common import markdown_table, vector_flags


def time_steps(optimizer: torch.optim.Optimizer, repeats: int) -> float:
    """Best of `repeats` steps, after one step that creates the state."""
    optimizer.step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("smollm2-135m-instruct"), dtype=torch.float32)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    count = sum(p.numel() for p in params)
    rows = {
        "ajet (build_optimizer)": build_optimizer(model, TrainerConfig(lr=1e-6))[0],
        "torch AdamW, default": torch.optim.AdamW(params, lr=1e-6),
        "torch AdamW, foreach": torch.optim.AdamW(params, lr=1e-6, foreach=True),
    }
    results = {name: time_steps(opt, args.repeats) for name, opt in rows.items()}
    base = results["torch AdamW, default"]
    flags = " ".join(vector_flags())
    print(f"AdamW step over {count / 1e6:.1f}M parameters, {torch.get_num_threads()} threads; CPU flags: {flags}")
    print(*markdown_table(["optimizer", f"step, s (best of {args.repeats})", "vs torch default"],
                          [[name, f"{seconds:.3f}", f"{base / seconds:.1f}x"] for name, seconds in results.items()],
                          right={1, 2}), sep="\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"parameters": count, "cpu_flags": flags, "seconds": results}, f, indent=1)


if __name__ == "__main__":
    main()
