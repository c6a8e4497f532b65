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

from ajet.envs.demos import demos_for_yaml
from ajet.workflow import WorkflowTask

HERE = Path(__file__).parent


def answer(messages: list[dict[str, Any]], task: WorkflowTask) -> str:
    return f"<answer>{task.metadata['answer']}</answer>"


def main(out_dir: Path = HERE, count: int = 256) -> Path:
    out = out_dir / "demos.jsonl"
    written, played = demos_for_yaml(HERE / "chain_sum.yaml", answer, out, count)
    print(f"{out}: {written} demonstrations of {played} items")
    return out


if __name__ == "__main__":
    main()
