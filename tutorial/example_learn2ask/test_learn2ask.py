"""Learn2ask trains for one step on the debug backbone (with the grader-free judge, and with
the YAML's LLM judge on the local model); the simulated patient answers only what is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
CALLS = 3 + 1  # max_questions questions, then the summary


@pytest.fixture
def patient_module(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(HERE))
    import patient

    return patient


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_the_elicitation_judge(one_step) -> None:
    run = one_step(HERE / "learn2ask_elicitation.yaml")
    metrics = run.assert_completed()
    assert metrics["rollout/failed"] == 0
    assert metrics["rollout/calls_per_episode"] == CALLS
    # The consultation is one conversation: its calls merge into one sample per episode.
    assert metrics["context/samples"] == metrics["rollout/ok"] < metrics["context/calls"]
    # The judge's reward is the fraction of facts uncovered, which the workflow also logs.
    assert metrics["reward/mean"] == pytest.approx(metrics["workflow/facts_elicited"])
    assert 0.0 <= metrics["workflow/summary_recall"] <= 1.0  # the second rubric, logged beside it
    records = run.records(1)
    assert all(len(r["segments"]) == CALLS for r in records)


@pytest.mark.tutorial
@pytest.mark.integration
def test_one_step_with_the_llm_judge(one_step) -> None:
    run = one_step(HERE / "learn2ask.yaml", "judge.params.max_tokens=16")
    metrics = run.assert_completed()
    # The tiny random grader rarely writes a score: on_parse_error=zero scores those 0 and
    # counts them; none of this fails an episode.
    assert metrics["rollout/failed"] == 0
    graded = metrics.get("judge/llm_parse_error", 0.0) + ("judge/llm_score" in metrics)
    assert graded > 0
    assert 0.0 <= metrics["reward/mean"] <= 1.0


def test_patient_answers_only_what_is_asked(patient_module) -> None:
    patient = patient_module.Patient({"duration": "Since Monday.", "fever": "No fever.", "allergies": "None."})
    assert patient.answer("Tell me more.") == patient_module.NOT_SURE
    assert patient.elicited == 0.0
    assert patient.answer("When did it start?") == "Since Monday."
    assert patient.answer("Any fever or allergies?") == "No fever. None."
    assert patient.revealed == {"duration", "fever", "allergies"} and patient.elicited == 1.0
    with pytest.raises(ValueError, match="unknown fact topics"):
        patient_module.Patient({"mood": "fine"})


def test_elicitation_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    from judge import ElicitationJudge

    from ajet.workflow import WorkflowOutput, WorkflowTask

    task = WorkflowTask(task_id="t", metadata={"facts": {"fever": "x", "duration": "y"}})
    judge = ElicitationJudge()
    assert judge.compute_reward(task, WorkflowOutput(metadata={"revealed": ["fever"]})) == (0.5, False)
    assert judge.compute_reward(task, WorkflowOutput(metadata={"revealed": ["fever", "duration"]})) == (1.0, True)
    assert judge.compute_reward(task, WorkflowOutput()) == (0.0, False)


def test_summary_judge_reads_the_facts_the_summary_states(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    from judge import SummaryJudge, fact_stated, summary_recall

    from ajet.workflow import WorkflowOutput, WorkflowTask

    assert fact_stated("I had a fever of 38.5 last night.", "She had a fever of 38.5 yesterday night.")
    assert not fact_stated("I have no fever.", "The patient has a fever.")  # the negation is content
    assert fact_stated("I have no fever.", "No fever.")
    assert not fact_stated("I am allergic to penicillin.", "Ask about allergies next time.")
    facts = {"fever": "I have no fever.", "allergies": "I am allergic to penicillin.",
             "severity": "It is about 6 out of 10.", "history": "This never happened before."}
    summary = "Back pain, 6 out of 10, allergic to penicillin, no fever. Rest and ibuprofen."
    assert summary_recall(summary, facts) == 0.75  # history is not stated
    task = WorkflowTask(task_id="t", metadata={"facts": facts})
    assert SummaryJudge().compute_reward(task, WorkflowOutput(metadata={"summary": summary})) == (0.75, False)
    assert SummaryJudge().compute_reward(task, WorkflowOutput()) == (0.0, False)


def test_demos_are_the_scripted_doctors_consultations(example_modules) -> None:  # noqa: ANN001
    """demos.jsonl (the SFT warm-up) is what make_demos.py makes: real workflow dialogs with
    three one-topic questions and a summary that restates exactly the answers that were facts."""
    import json

    example_modules(HERE, "make_data", "make_demos", "patient", "judge", "learn2ask")
    import make_demos
    import patient

    # Each scripted question touches its own topic's keywords and no other's.
    for topic, questions in make_demos.QUESTIONS.items():
        for question in questions:
            touched = [t for t, words in patient.TOPICS.items() if any(w in question.lower() for w in words)]
            assert touched == [topic], question
    shipped = [json.loads(line) for line in (HERE / "demos.jsonl").read_text().splitlines()]
    assert len(shipped) == 256
    tasks = make_demos.demo_tasks(256)
    made = [make_demos.asyncio.run(make_demos.demo(t, i)) for i, t in enumerate(tasks[:4])]
    assert made == shipped[:4]  # deterministic, and the shipped file is current
    train_ids = {json.loads(line)["task_id"] for line in (HERE / "train.jsonl").read_text().splitlines()}
    assert {t["task_id"] for t in tasks[:64]} == train_ids  # the train patients first, no val or test one
    for dialog, task in zip(shipped, tasks, strict=True):
        messages = dialog["messages"]
        questions = [m["content"] for m in messages[:-1] if m["role"] == "assistant"]
        assert len(questions) == 3 and len({make_demos.QUESTIONS_TOPIC[q] for q in questions}) == 3
        sick = patient.Patient(task["facts"])
        answers = [sick.answer(q) for q in questions]
        told = [a for a in answers if a != patient.NOT_SURE]
        summary = messages[-1]["content"]
        assert all(a in summary for a in told)
        assert not any(fact in summary for fact in set(task["facts"].values()) - set(told))
