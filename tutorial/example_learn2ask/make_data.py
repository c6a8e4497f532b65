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

COMPLAINTS = ["a headache", "a cough", "a stomach ache", "back pain", "a rash", "a sore throat"]
FACTS = {
    "duration": ["It started yesterday.", "It started three days ago.", "It has been going on for two weeks."],
    "severity": ["It is mild, maybe 3 out of 10.", "It is about 6 out of 10.", "It is very bad, 9 out of 10."],
    "fever": ["I have no fever.", "I had a fever of 38.5 last night."],
    "medication": ["I am not taking anything.", "I took ibuprofen twice.", "I take blood pressure pills every day."],
    "allergies": ["I have no allergies.", "I am allergic to penicillin."],
    "history": ["This never happened before.", "I had the same thing last year."],
}


def patient(rng: random.Random) -> tuple[str, dict[str, str]]:
    complaint = rng.choice(COMPLAINTS)
    topics = sorted(rng.sample(sorted(FACTS), 4))  # four facts per patient
    return complaint, {t: rng.choice(FACTS[t]) for t in topics}


def patient_task(task_id: str, rng: random.Random) -> dict:
    """One row: a patient drawn from `rng`, its opening line, facts and reference answer."""
    complaint, facts = patient(rng)
    return {
        "task_id": task_id,
        "question": f"Hello doctor, I have {complaint}.",
        "facts": facts,
        "max_questions": 3,
        "answer": f"The patient has {complaint}. The patient says: " + " ".join(facts.values()),
    }


def main() -> None:
    here = Path(__file__).parent
    for split, count, seed in (("train", 64, 0), ("val", 16, 1), ("test", 16, 2)):
        rng = random.Random(seed)
        rows = [patient_task(f"{split}-{i}", rng) for i in range(count)]
        (here / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    import make_demos  # the SFT warm-up's consultations come from these train patients

    make_demos.main(here)


if __name__ == "__main__":
    main()
