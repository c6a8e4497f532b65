"""Generate reader: an LLM writes tasks from documents; robust parsing, dedup, cache."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ajet.config.schema import GenerateReaderConfig, ReaderType, TaskReaderConfig
from ajet.task_reader import TaskReaderError, abuild_reader, build_reader
from ajet.task_reader.generate import normalise_question, parse_qa_pairs

REPLY = """Here are the pairs:
```json
{"question": "What colour is the sky?", "answer": "blue"}
1. {"question": "How many legs has a spider?", "answer": 8}
{"question": "what colour is the SKY", "answer": "Blue"}
{"question": "broken", "answer":
not json at all
{"question": "", "answer": "empty question"}
```"""


class FakeLLM:
    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies
        self.prompts: list[str] = []

    async def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        await asyncio.sleep(0)
        return next(reply for name, reply in self.replies.items() if f"({name})" in prompt)


def gen_cfg(docs: list[Path], cache: Path | None = None, n: int = 3) -> TaskReaderConfig:
    return TaskReaderConfig(type=ReaderType.generate, generate=GenerateReaderConfig(
        documents=[str(d) for d in docs], tasks_per_document=n, cache_path=str(cache or "")))


@pytest.fixture
def docs(tmp_path: Path) -> list[Path]:
    a, b = tmp_path / "sky.txt", tmp_path / "spiders.txt"
    a.write_text("The sky is blue on a clear day.")
    b.write_text("Spiders have eight legs. Insects have six.")
    return [a, b]


def test_parse_skips_and_counts_bad_lines() -> None:
    pairs, skipped = parse_qa_pairs(REPLY)
    assert pairs == [
        ("What colour is the sky?", "blue"),
        ("How many legs has a spider?", "8"),
        ("what colour is the SKY", "Blue"),
    ]
    assert skipped == 4  # prose, broken JSON, not JSON, empty question


def test_parse_json_list_reply() -> None:
    pairs, skipped = parse_qa_pairs('[{"question": "a?", "answer": "1"}, {"q": "x"}]')
    assert pairs == [("a?", "1")] and skipped == 1


def test_normalise_question() -> None:
    assert normalise_question("  What colour is the SKY? ") == normalise_question("what colour, is the sky")


def test_generates_dedups_and_caches(tmp_path: Path, docs: list[Path]) -> None:
    llm = FakeLLM({
        "sky.txt": REPLY,
        "spiders.txt": '{"question": "How many legs has an insect?", "answer": "6"}\n'
                       '{"question": "How many legs has a spider", "answer": "8"}',  # dup of doc 1
    })
    cache = tmp_path / "cache" / "tasks.jsonl"
    reader = build_reader(gen_cfg(docs, cache), seed=0, llm=llm)
    tasks = reader.train_tasks()
    assert [t.main_query for t in tasks] == [
        "What colour is the sky?", "How many legs has a spider?", "How many legs has an insect?",
    ]
    assert [t.metadata["answer"] for t in tasks] == ["blue", "8", "6"]
    assert tasks[2].metadata["source"] == str(docs[1])
    assert reader.skipped == 4
    assert len(llm.prompts) == 2
    assert "The sky is blue" in llm.prompts[0] and "3 question/answer pairs" in llm.prompts[0]

    # the second build reads the cache and never calls the llm
    def no_llm(prompt: str):
        raise AssertionError("the llm must not be called when the cache is valid")

    again = build_reader(gen_cfg(docs, cache), seed=0, llm=no_llm)
    assert [(t.task_id, t.main_query, t.metadata) for t in again.train_tasks()] == \
        [(t.task_id, t.main_query, t.metadata) for t in tasks]
    assert build_reader(gen_cfg(docs, cache), seed=0, llm=None).train_tasks() == again.train_tasks()

    # a changed document invalidates the cache
    docs[0].write_text("The sky is grey in Oslo.")
    build_reader(gen_cfg(docs, cache), seed=0, llm=llm)
    assert len(llm.prompts) == 4


def test_without_llm_or_cache_is_an_error(docs: list[Path]) -> None:
    with pytest.raises(TaskReaderError, match="needs an llm"):
        build_reader(gen_cfg(docs), seed=0)


def test_nothing_parsable_is_an_error(docs: list[Path]) -> None:
    llm = FakeLLM({"sky.txt": "I cannot do that.", "spiders.txt": "Sorry."})
    with pytest.raises(TaskReaderError, match=r"no parsable tasks .*2 lines skipped"):
        build_reader(gen_cfg(docs), seed=0, llm=llm)


def test_inside_a_running_loop(docs: list[Path], tmp_path: Path) -> None:
    llm = FakeLLM({"sky.txt": REPLY, "spiders.txt": ""})

    async def main() -> tuple[int, int]:
        a = await abuild_reader(gen_cfg(docs), seed=0, llm=llm)
        b = build_reader(gen_cfg(docs), seed=0, llm=llm)  # sync call from inside a loop
        return len(a.train_tasks()), len(b.train_tasks())

    assert asyncio.run(main()) == (2, 2)


def test_cache_is_plain_jsonl(tmp_path: Path, docs: list[Path]) -> None:
    cache = tmp_path / "t.jsonl"
    build_reader(gen_cfg(docs[:1], cache), seed=0, llm=FakeLLM({"sky.txt": REPLY}))
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert rows[0]["question"] == "What colour is the sky?" and rows[0]["answer"] == "blue"


def test_a_cache_without_its_meta_file_is_refused(tmp_path: Path, docs: list[Path]) -> None:
    cache = tmp_path / "t.jsonl"
    build_reader(gen_cfg(docs[:1], cache), seed=0, llm=FakeLLM({"sky.txt": REPLY}))
    meta = cache.with_name("t.jsonl.meta.json")
    meta.unlink()  # as a run killed between writing the tasks and their fingerprint leaves it
    with pytest.raises(TaskReaderError, match=r"t\.jsonl\.meta\.json.*(missing|unreadable)") as err:
        build_reader(gen_cfg(docs[:1], cache), seed=0, llm=None)
    assert "with an llm" in str(err.value) and "task_reader.type=jsonl" in str(err.value)
    meta.write_text('{"fingerprint": "abc')  # half-written
    with pytest.raises(TaskReaderError, match="unreadable"):
        build_reader(gen_cfg(docs[:1], cache), seed=0, llm=None)
    # with an llm, the cache is written again, fingerprint and all
    llm = FakeLLM({"sky.txt": REPLY})
    build_reader(gen_cfg(docs[:1], cache), seed=0, llm=llm)
    assert len(llm.prompts) == 1 and json.loads(meta.read_text())["num_tasks"] == 2


def test_a_cache_rewrite_killed_halfway_is_never_taken_for_the_old_one(
        tmp_path: Path, docs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from ajet.task_reader import generate

    cache = tmp_path / "t.jsonl"
    build_reader(gen_cfg(docs[:1], cache), seed=0, llm=FakeLLM({"sky.txt": REPLY}))
    docs[0].write_text("The sky is grey in Oslo.")
    real = generate.write_json_atomic

    def killed(path: Path, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # the kill lands after the tasks, before their fingerprint

    monkeypatch.setattr(generate, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        build_reader(gen_cfg(docs[:1], cache), seed=0, llm=FakeLLM({"sky.txt": '{"question": "q?", "answer": "grey"}'}))
    monkeypatch.setattr(generate, "write_json_atomic", real)
    docs[0].write_text("The sky is blue on a clear day.")  # back to the documents of the old meta
    with pytest.raises(TaskReaderError, match="meta"):
        build_reader(gen_cfg(docs[:1], cache), seed=0, llm=None)
