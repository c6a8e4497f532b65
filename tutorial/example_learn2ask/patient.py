"""The simulated patient: answers a doctor's questions from a hidden profile (no model).

A profile is a set of facts, each under a topic ("duration", "fever", ...). A question that
touches a topic's keywords gets that fact as an answer; a question touching none gets a
request to be more specific. `elicited` is the fraction of facts the doctor uncovered.
"""

from __future__ import annotations

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
