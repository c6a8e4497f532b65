"""Regenerate demos.jsonl: demonstrations for the SFT warm-up of `chain_sum.yaml`, the
dataset's own answers in reasoning-gym's answer format, from a seed range of their own (never
val or test).

    python tutorial/example_reasoning_gym/make_demos.py

A scripted policy answers each item with `<answer>{the item's answer}</answer>` through the
unchanged adapter workflow (`ajet.envs.demos`), so the warm-up teaches the exact prompt the model
sees during RL. Deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ajet.config.loader import load_config
from ajet.envs.demos import write_demos
from ajet.workflow import WorkflowTask

HERE = Path(__file__).parent
DEMO_SEEDS = 3_000_000  # train from 0, val from 1e6, test from 2e6 (env.seed + k * 1e6)


def answer(messages: list[dict[str, Any]], task: WorkflowTask) -> str:
    return f"<answer>{task.metadata['answer']}</answer>"


def config() -> Any:
    # the demo file is the SFT stage's input: the config without that stage
    return load_config(HERE / "chain_sum.yaml", ["pipeline.stages=[grpo]", "pipeline.overrides.sft=null"])


def main(out_dir: Path = HERE, count: int = 256) -> Path:
    cfg = config().env
    out = out_dir / "demos.jsonl"
    written, played = write_demos(cfg, answer, out, seeds_from=cfg.seed + DEMO_SEEDS, count=count)
    print(f"{out}: {written} demonstrations of {played} items")
    return out


if __name__ == "__main__":
    main()
