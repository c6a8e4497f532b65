"""Regenerate dialogs.jsonl: agent dialogs for an SFT warm-up before RL (deterministic).

    python tutorial/example_sft_warmup/make_data.py

Three task types, built only from the *train* splits of two tutorials (their val tasks
stay unseen, so `ajet eval` on them measures generalisation):
- `adder`: the one-digit adder of tutorial/example_function_workflow, answered with the
  number alone (the format its reward wants);
- `adder_multi`: two additions in one conversation (two trained assistant turns);
- `math_tool`: the math agent of tutorial/example_math_agent calling its `calculate`
  tool once, then answering in \\boxed{} (target_tools: ["calculate"]).
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

HERE = Path(__file__).parent
ADDER = HERE.parent / "example_function_workflow"
MATH = HERE.parent / "example_math_agent"

# The prompts the two workflows send (adder.py SYSTEM_PROMPT, math_agent.py SYSTEM_PROMPT).
ADDER_SYSTEM = "You are a calculator. Reply with the result only, as digits, nothing else."
MATH_SYSTEM = (
    "You solve arithmetic word problems. You may call the `calculate` tool with an arithmetic "
    "expression. Give the final answer as a number in \\boxed{}, e.g. \\boxed{42}."
)


def math_tool() -> dict:
    """The math agent's `calculate` tool spec, from its one copy (example_math_agent/calculator_tool.py,
    loaded from its file: this script runs from any directory)."""
    spec = importlib.util.spec_from_file_location("sft_warmup_calculator", MATH / "calculator_tool.py")
    assert spec is not None and spec.loader is not None
    calculator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calculator)
    return calculator.CALCULATE_TOOL


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def adder_dialogs(tasks: list[dict]) -> list[dict]:
    return [
        {
            "id": f"adder-{t['task_id']}",
            "task_type": "adder",
            "messages": [
                {"role": "system", "content": ADDER_SYSTEM},
                {"role": "user", "content": t["question"]},
                {"role": "assistant", "content": t["answer"]},
            ],
        }
        for t in tasks
    ]


def multi_turn_dialogs(tasks: list[dict], count: int, rng: random.Random) -> list[dict]:
    out = []
    for i in range(count):
        first, second = rng.sample(tasks, 2)
        out.append({
            "id": f"adder_multi-{i}",
            "task_type": "adder_multi",
            "messages": [
                {"role": "system", "content": ADDER_SYSTEM},
                {"role": "user", "content": first["question"]},
                {"role": "assistant", "content": first["answer"]},
                {"role": "user", "content": second["question"]},
                {"role": "assistant", "content": second["answer"]},
            ],
        })
    return out


def math_tool_dialogs(tasks: list[dict], count: int) -> list[dict]:
    tool, out = math_tool(), []
    for t in tasks[:count]:
        expression = t["expression"]  # the math tutorial's tasks carry the expression that solves them
        call = {"id": f"call_{t['task_id']}", "type": "function",
                "function": {"name": "calculate", "arguments": json.dumps({"expression": expression})}}
        out.append({
            "id": f"math_tool-{t['task_id']}",
            "task_type": "math_tool",
            "target_tools": ["calculate"],
            "tools": [tool],
            "messages": [
                {"role": "system", "content": MATH_SYSTEM},
                {"role": "user", "content": t["question"]},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": t["answer"]},
                {"role": "assistant", "content": f"\\boxed{{{t['answer']}}}"},
            ],
        })
    return out


def main(out_dir: Path = HERE) -> Path:
    rng = random.Random(0)
    adder_train = read(ADDER / "train.jsonl")
    dialogs = adder_dialogs(adder_train)
    dialogs += multi_turn_dialogs(adder_train, 16, rng)
    dialogs += math_tool_dialogs(read(MATH / "train.jsonl"), 48)
    path = out_dir / "dialogs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in dialogs))
    return path


if __name__ == "__main__":
    main()
