"""Regenerate demos.jsonl: demonstrations for the SFT warm-up (`countdown_warmup.yaml`), made
from the TRAIN puzzles only (never val or test).

    python tutorial/example_countdown/make_demos.py

Each train puzzle is built backwards from an expression (make_data.py's `solution`), so a
demonstration is the exact messages `CountdownAgent` sends, answered with that expression in
the answer tags: `<answer>(13 * 3) - 24</answer>`. One SFT dialog per puzzle (docs/pipeline.md).
Deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

from countdown import SYSTEM_PROMPT, user_prompt

HERE = Path(__file__).parent


def demo(row: dict) -> dict:
    return {
        "id": f"countdown-{row['task_id']}",
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_prompt(row["numbers"], row["target"])},
            {"role": "assistant", "content": f"<answer>{row['solution']}</answer>"},
        ],
    }


def main() -> None:
    rows = [json.loads(line) for line in (HERE / "train.jsonl").read_text().splitlines() if line.strip()]
    (HERE / "demos.jsonl").write_text("".join(json.dumps(demo(r)) + "\n" for r in rows))


if __name__ == "__main__":
    main()
