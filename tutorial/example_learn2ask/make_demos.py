"""Regenerate demos.jsonl: consultations for the SFT warm-up (`learn2ask_warmup.yaml`), made
from TRAIN patients and patients of a seed of their own, never from val or test.

    python tutorial/example_learn2ask/make_demos.py

A scripted doctor plays the model behind the unchanged `Learn2Ask` workflow. It knows nothing
of the hidden profile: each consultation it asks about three topics drawn at random (one short
question per turn, one topic each, in words the patient understands), then writes a summary
that restates what the patient answered, plus one line of advice. So the demonstrations teach
the format (one question a turn, a summary that keeps the answers), not which topics a patient
holds: a random three of the six topics uncover half of a patient's four facts on average, and
choosing better is left to RL. The dialog the workflow sent for the summary plus the summary is
one SFT dialog (docs/pipeline.md): every reply in it is trained. Deterministic.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from patient import NOT_SURE, patient_task

HERE = Path(__file__).parent
DEMO_SEED = 3  # the extra demo patients' seed (make_data: train 0, val 1, test 2)

# Each question touches its own topic's keywords and no other's (tested).
QUESTIONS: dict[str, tuple[str, ...]] = {
    "duration": ("When did it start?", "How long have you had it?", "Since when have you had this?"),
    "severity": ("How bad is it?", "How severe is it, on a scale of 1 to 10?", "How strong is the pain?"),
    "fever": ("Do you have a fever?", "Have you had a fever or a high temperature?"),
    "medication": ("Are you taking any medication?", "Have you taken any medicine for it?"),
    "allergies": ("Do you have any allergies?", "Are you allergic to anything?"),
    "history": ("Has this happened before?", "Is this the first time you have had it?"),
}
QUESTIONS_TOPIC = {q: topic for topic, questions in QUESTIONS.items() for q in questions}
ADVICE = (
    "My advice: rest, drink plenty of water, and come back if it gets worse.",
    "My advice: take it easy for a few days and see me again if it does not improve.",
    "My advice: keep an eye on it, and come back at once if it gets worse.",
)


def summary(answers: list[str], rng: random.Random) -> str:
    """What the patient said (the answers that were facts), then one line of advice."""
    told = [a for a in answers if a != NOT_SURE]
    said = f"You told me: {' '.join(told)}" if told else "You could not tell me more."
    return f"{said} {rng.choice(ADVICE)}"


class ScriptedClient:
    """Stands in for `tuner.openai_client()`: asks about `topics` in turn, then summarises."""

    def __init__(self, topics: list[str], rng: random.Random) -> None:
        self.topics, self.rng = list(topics), rng
        self.calls: list[list[dict[str, Any]]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, model: str, messages: list[dict[str, Any]]) -> Any:  # noqa: ARG002
        self.calls.append([dict(m) for m in messages])
        if self.topics:
            text = self.rng.choice(QUESTIONS[self.topics.pop(0)])
        else:  # the summary request: restate the patient's answers (every user turn after the opening)
            text = summary([m["content"] for m in messages[2:-1] if m["role"] == "user"], self.rng)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))])


async def demo(task: dict, index: int) -> dict:
    """One SFT dialog: the scripted doctor's consultation with `task`'s patient, through the
    real workflow."""
    from learn2ask import Learn2Ask

    from ajet import WorkflowTask

    rng = random.Random(f"learn2ask-demo-{index}")
    client = ScriptedClient(rng.sample(sorted(QUESTIONS), int(task.get("max_questions", 3))), rng)
    tuner = SimpleNamespace(openai_client=lambda: client)
    output = await Learn2Ask().execute(WorkflowTask(task_id=task["task_id"], main_query=task["question"],
                                                    metadata=task), tuner)
    last, reply = client.calls[-1], output.metadata["summary"]
    return {"id": f"learn2ask-{task['task_id']}", "task_type": "learn2ask",
            "messages": [*last, {"role": "assistant", "content": reply}]}


def demo_tasks(count: int) -> list[dict]:
    """The train patients, then patients drawn as make_data draws them from DEMO_SEED, up to
    `count` (a profile may repeat one of val's or test's: it is 4 of 6 topics with 2-3 answers
    each, and the demos never see a val or test task's id or opening)."""
    tasks = [json.loads(line) for line in (HERE / "train.jsonl").read_text().splitlines() if line.strip()]
    rng = random.Random(DEMO_SEED)
    while len(tasks) < count:
        tasks.append(patient_task(f"demo-{len(tasks)}", rng))
    return tasks[:count]


def main(out_dir: Path = HERE, count: int = 256) -> Path:
    rows = [asyncio.run(demo(task, i)) for i, task in enumerate(demo_tasks(count))]
    out = out_dir / "demos.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


if __name__ == "__main__":
    print(main())
