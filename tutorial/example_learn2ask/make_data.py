"""Regenerate train.jsonl / val.jsonl / test.jsonl: patients with hidden profiles (deterministic).

    python tutorial/example_learn2ask/make_data.py

Each row: the patient's vague opening line (`question`), the hidden `facts` the simulated
patient answers from, and `answer`: the facts as one text, which the LLM judge sees as the
reference ("Reference answer") when it grades the consultation. Val is the split to tune
settings on and to validate on during training; test (its own seed) is only reported on
(`eval.split: test`). It then runs make_demos.py (demos.jsonl, the SFT warm-up's
consultations, from train patients and patients of their own).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import make_demos  # the SFT warm-up's consultations come from these train patients
from patient import patient_task


def main() -> None:
    here = Path(__file__).parent
    for split, count, seed in (("train", 64, 0), ("val", 16, 1), ("test", 16, 2)):
        rng = random.Random(seed)
        rows = [patient_task(f"{split}-{i}", rng) for i in range(count)]
        (here / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    make_demos.main(here)


if __name__ == "__main__":
    main()
