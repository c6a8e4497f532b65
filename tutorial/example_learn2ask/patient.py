"""The simulated patient: answers a doctor's questions from a hidden profile (no model).

A profile is a set of facts, each under a topic ("duration", "fever", ...). A question that
touches a topic's keywords gets that fact as an answer; a question touching none gets a
request to be more specific. `elicited` is the fraction of facts the doctor uncovered.
`patient_task` draws a patient as a task row (make_data.py's splits, make_demos.py's own).
"""

from __future__ import annotations

import random

# Topic -> words that show a question is about it (matched in the lower-cased question).
TOPICS: dict[str, tuple[str, ...]] = {
    "duration": ("how long", "when did", "since when", "start", "began", "begin"),
    "severity": ("how bad", "severe", "scale", "rate", "intense", "strong"),
    "fever": ("fever", "temperature"),
    "medication": ("medication", "medicine", "taking", "taken", "pill", "drug", "treat"),
    "allergies": ("allerg",),
    "history": ("before", "history", "previous", "happened", "first time"),
}
NOT_SURE = "I'm not sure what you mean. Could you ask me something more specific?"


class Patient:
    def __init__(self, facts: dict[str, str]) -> None:
        unknown = set(facts) - set(TOPICS)
        if unknown:
            raise ValueError(f"unknown fact topics {sorted(unknown)}; topics are {sorted(TOPICS)}")
        self.facts = dict(facts)
        self.revealed: set[str] = set()

    def answer(self, question: str) -> str:
        text = question.lower()
        topics = [t for t in self.facts if any(word in text for word in TOPICS[t])]
        if not topics:
            return NOT_SURE
        self.revealed.update(topics)
        return " ".join(self.facts[t] for t in topics)

    @property
    def elicited(self) -> float:
        return len(self.revealed) / len(self.facts) if self.facts else 1.0


COMPLAINTS = ["a headache", "a cough", "a stomach ache", "back pain", "a rash", "a sore throat"]
# Topic -> the facts a patient may have under it (a profile holds one for each of 4 topics).
FACTS = {
    "duration": ["It started yesterday.", "It started three days ago.", "It has been going on for two weeks."],
    "severity": ["It is mild, maybe 3 out of 10.", "It is about 6 out of 10.", "It is very bad, 9 out of 10."],
    "fever": ["I have no fever.", "I had a fever of 38.5 last night."],
    "medication": ["I am not taking anything.", "I took ibuprofen twice.", "I take blood pressure pills every day."],
    "allergies": ["I have no allergies.", "I am allergic to penicillin."],
    "history": ["This never happened before.", "I had the same thing last year."],
}


def draw_profile(rng: random.Random) -> tuple[str, dict[str, str]]:
    """(a complaint, the facts of four topics) drawn from `rng`."""
    complaint = rng.choice(COMPLAINTS)
    topics = sorted(rng.sample(sorted(FACTS), 4))  # four facts per patient
    return complaint, {t: rng.choice(FACTS[t]) for t in topics}


def patient_task(task_id: str, rng: random.Random) -> dict:
    """One row: a patient drawn from `rng`, its opening line, facts and reference answer."""
    complaint, facts = draw_profile(rng)
    return {
        "task_id": task_id,
        "question": f"Hello doctor, I have {complaint}.",
        "facts": facts,
        "max_questions": 3,
        "answer": f"The patient has {complaint}. The patient says: " + " ".join(facts.values()),
    }
