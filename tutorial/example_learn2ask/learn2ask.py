"""Learn to ask: a doctor agent asks clarifying questions, then summarises (OpenAI SDK).

The patient is simulated (patient.py): it answers from a hidden profile in the task and
says nothing it is not asked about, so the agent has to ask the right questions. After
`max_questions` questions the agent writes its summary. The reward comes from the judge
(judge.type: llm): a grader model reads the consultation, with the hidden profile as the
reference, and scores it against the rubric in learn2ask.yaml.
"""

from __future__ import annotations

from typing import Any

from judge import summary_recall
from patient import Patient

from ajet import Workflow, WorkflowOutput, WorkflowTask

SYSTEM_PROMPT = (
    "You are a doctor in a short consultation. The patient tells you little at first. Ask one "
    "short, specific question per turn (for example about when it started, how bad it is, "
    "fever, medication, allergies, or whether it happened before). When asked for your "
    "summary, state the facts the patient told you and your advice in two or three sentences."
)
SUMMARY_REQUEST = "That is all the time we have. Please give your summary and advice."


class Learn2Ask(Workflow):
    name: str = "learn2ask"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        patient = Patient(task.metadata["facts"])
        client = tuner.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.main_query},
        ]
        transcript = [f"Patient: {task.main_query}"]
        for _ in range(int(task.metadata.get("max_questions", 3))):
            question = await self._reply(client, messages)
            answer = patient.answer(question)
            messages.append({"role": "user", "content": answer})
            transcript += [f"Doctor: {question}", f"Patient: {answer}"]
        messages.append({"role": "user", "content": SUMMARY_REQUEST})
        summary = await self._reply(client, messages)
        transcript.append(f"Doctor's summary: {summary}")
        # reward=None: the LLM judge grades the whole consultation (the final_answer).
        return WorkflowOutput(
            reward=None,
            metadata={"final_answer": "\n".join(transcript), "revealed": sorted(patient.revealed),
                      "summary": summary},
            # both grader-free rubrics (judge.py), whatever the judge: a second opinion on the run
            log_metrics={"facts_elicited": patient.elicited,
                         "summary_recall": summary_recall(summary, task.metadata["facts"])},
        )

    @staticmethod
    async def _reply(client: Any, messages: list[dict[str, Any]]) -> str:
        response = await client.chat.completions.create(model="policy", messages=messages)
        text = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})  # as received: calls extend
        return text
