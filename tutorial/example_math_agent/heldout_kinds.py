"""Write a validation of *held-out templates* for the code agent: the split to tune settings on
when what you want is transfer to phrasings training never shows (what test measures), not
fit on train's own templates (what val measures, and where the code agent is already at 0.94).

    python tutorial/example_math_agent/heldout_kinds.py /tmp/hk
    ajet --conf tutorial/example_math_agent/code_agent.yaml --backbone=debug eval.split=val \\
      'pipeline.stages=[sft,grpo,eval]' task_reader.jsonl.train_path=/tmp/hk/train.jsonl \\
      task_reader.jsonl.val_path=/tmp/hk/val.jsonl sft.train_path=/tmp/hk/demos.jsonl

A seeded draw picks 3 of train's 9 math templates and 2 of its 5 problems where code helps.
`train.jsonl` and `demos.jsonl` are code_train.jsonl and code_demos.jsonl without them; `val.jsonl`
is up to 96 tasks of only those templates (from code_train.jsonl and code_val.jsonl, never test).
The draw is made from the kinds' names alone, so nothing about test chooses it. Deterministic.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def held_out(tasks: list[dict], seed: int = 0, math: int = 3, code: int = 2) -> set[str]:
    """The templates to hold out: `math` of the calculator's and `code` of the problems where
    code helps (those keep a `program`)."""
    math_kinds = sorted({t["kind"] for t in tasks if "program" not in t})
    code_kinds = sorted({t["kind"] for t in tasks if "program" in t})
    rng = random.Random(seed)
    return set(rng.sample(math_kinds, math)) | set(rng.sample(code_kinds, code))


def main(out_dir: Path, seed: int = 0, val_size: int = 96) -> dict[str, Path]:
    train, val = read(HERE / "code_train.jsonl"), read(HERE / "code_val.jsonl")
    demos = read(HERE / "code_demos.jsonl")
    held = held_out(train, seed)
    kind = {f"code_agent-{t['task_id']}": t["kind"] for t in train}
    heldout_val = [t for t in train + val if t["kind"] in held]
    random.Random(seed + 1).shuffle(heldout_val)
    rows = {"train": [t for t in train if t["kind"] not in held],
            "demos": [d for d in demos if kind[d["id"]] not in held],
            "val": heldout_val[:val_size]}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, items in rows.items():
        paths[name] = out_dir / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(item) + "\n" for item in items))
    print(f"held out: {', '.join(sorted(held))}; train {len(rows['train'])}, demos {len(rows['demos'])}, "
          f"val {len(rows['val'])} -> {out_dir}")
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tutorial/example_math_agent/heldout_kinds.py OUT_DIR")
    main(Path(sys.argv[1]))
