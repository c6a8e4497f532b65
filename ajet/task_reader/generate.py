"""Tasks written by an LLM from text documents, cached so a rebuild does not call it again.

For each document the `llm` callable (`async (prompt) -> text`, given by the backbone) is
asked for `tasks_per_document` lines of `{"question": ..., "answer": ...}`. Output is parsed
line by line (code fences, numbering and surrounding prose are tolerated); what cannot be
parsed is skipped and counted. Questions are deduplicated by their normalised text. With a
`cache_path`, the tasks are written there as JSONL, next to a `.meta.json` fingerprint of
the documents and settings; a later build with the same fingerprint reads the cache.

Both files are written atomically, the meta file last (and the old one removed first), so a
run killed while writing leaves either a complete cache or one without its meta file. A cache
without a readable meta file is never trusted: it is regenerated, or refused without an llm.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ajet.config.schema import GenerateReaderConfig
from ajet.files import write_json_atomic, write_text_atomic
from ajet.task_reader.base import TaskReaderError
from ajet.task_reader.jsonl import read_jsonl_tasks
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)

LLM = Callable[[str], Awaitable[str]]
T = TypeVar("T")
MAX_DOC_CHARS = 8000
PROMPT = (
    "Read the document below and write {n} question/answer pairs that can be answered from "
    "the document alone. Keep each answer short (a number, a name or a phrase).\n"
    'Reply with exactly {n} lines, each one JSON object: {{"question": "...", "answer": "..."}}\n'
    "Write nothing else.\n\nDocument ({name}):\n{text}"
)
PROMPT_VERSION = 1  # bump when PROMPT changes, so caches are rebuilt


def normalise_question(text: str) -> str:
    """Lowercase, drop punctuation, collapse whitespace: the key for deduplication."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def parse_qa_pairs(text: str) -> tuple[list[tuple[str, str]], int]:
    """(question, answer) pairs in an LLM reply, and how many non-empty lines were unusable."""
    text = text.strip()
    if text.startswith("["):  # the model answered with one JSON list
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list):
            pairs: list[tuple[str, str]] = [p for p in (_pair(item) for item in items) if p]
            return pairs, len(items) - len(pairs)
    pairs = []
    skipped = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("```"):
            continue
        match = re.search(r"\{.*\}", line)
        item = None
        if match:
            try:
                item = json.loads(match.group(0))
            except json.JSONDecodeError:
                item = None
        pair = _pair(item)
        if pair is None:
            skipped += 1
        else:
            pairs.append(pair)
    return pairs, skipped


def _pair(item: Any) -> tuple[str, str] | None:
    if not isinstance(item, dict):
        return None
    question, answer = item.get("question"), item.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(question, str) or not isinstance(answer, str):
        return None
    if not question.strip() or not answer.strip():
        return None
    return question.strip(), answer.strip()


def load_generated_tasks(cfg: GenerateReaderConfig, llm: LLM | None) -> tuple[list[WorkflowTask], int]:
    """(tasks, skipped outputs) from the cache when valid, else from the llm (then cached)."""
    return run_sync(aload_generated_tasks(cfg, llm))


async def aload_generated_tasks(
    cfg: GenerateReaderConfig, llm: LLM | None
) -> tuple[list[WorkflowTask], int]:
    """`load_generated_tasks` inside a running event loop (the llm may be bound to it)."""
    docs = [Path(d) for d in cfg.documents]
    if not docs:
        raise TaskReaderError("task_reader.generate.documents is empty; list at least one text file")
    for doc in docs:
        if not doc.is_file():
            raise TaskReaderError(f"task_reader.generate.documents: file not found: {doc}")
    fingerprint = _fingerprint(docs, cfg.tasks_per_document)
    cache = Path(cfg.cache_path) if cfg.cache_path else None
    if cache is not None and cache.is_file():
        meta, problem = _read_meta(cache)
        if meta is not None and meta.get("fingerprint") == fingerprint:
            logger.info("generate reader: using cached tasks from %s", cache)
            tasks, _ = read_jsonl_tasks(cache)
            return tasks, 0
        if problem is not None and llm is None:
            raise TaskReaderError(
                f"task_reader.generate.cache_path: {problem}, so {cache} may be incomplete (a run killed "
                "while writing it?) and is not used. Build the reader with an llm (the backbone passes "
                "one) to write the tasks again; for tasks written by hand, use task_reader.type=jsonl")
        logger.warning("generate reader: %s; regenerating %s", problem or "documents or settings changed", cache)
    if llm is None:
        raise TaskReaderError(
            "the generate reader needs an llm to write tasks (the backbone passes one to "
            f"build_reader), or a valid cache at task_reader.generate.cache_path ({cache or 'unset'})"
        )
    tasks, skipped = await _generate(docs, cfg.tasks_per_document, llm)
    if not tasks:
        raise TaskReaderError(
            f"the llm wrote no parsable tasks for {[str(d) for d in docs]} ({skipped} lines "
            'skipped); it must answer with lines like {"question": "...", "answer": "..."}'
        )
    if cache is not None:
        _write_cache(cache, tasks, fingerprint)
    return tasks, skipped


async def _generate(docs: list[Path], n: int, llm: LLM) -> tuple[list[WorkflowTask], int]:
    prompts = []
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        if len(text) > MAX_DOC_CHARS:
            logger.warning("%s: using its first %d of %d characters", doc, MAX_DOC_CHARS, len(text))
        prompts.append(PROMPT.format(n=n, name=doc.name, text=text[:MAX_DOC_CHARS]))
    replies = await asyncio.gather(*(llm(p) for p in prompts))
    tasks: list[WorkflowTask] = []
    seen: set[str] = set()
    skipped = 0
    for doc, reply in zip(docs, replies, strict=True):
        pairs, bad = parse_qa_pairs(reply)
        if bad:
            logger.warning("%s: skipped %d unparsable lines of the llm's reply", doc, bad)
        skipped += bad
        for question, answer in pairs:
            key = normalise_question(question)
            if key in seen:
                continue
            seen.add(key)
            digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:10]
            tasks.append(WorkflowTask(
                task_id=f"gen-{doc.stem}-{digest}",
                main_query=question,
                metadata={"answer": answer, "source": str(doc)},
            ))
    return tasks, skipped


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion from sync code, also when an event loop is already running
    (then in a helper thread with its own loop: the llm must not be bound to the caller's loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name="ajet-generate")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _fingerprint(docs: list[Path], n: int) -> str:
    digest = hashlib.sha256(f"v{PROMPT_VERSION}:{n}".encode())
    for doc in docs:
        digest.update(str(doc.resolve()).encode("utf-8") + b"\0" + doc.read_bytes() + b"\0")
    return digest.hexdigest()


def _meta_path(cache: Path) -> Path:
    return cache.with_name(cache.name + ".meta.json")


def _read_meta(cache: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the cache's meta, None), or (None, why it cannot be used)."""
    meta_path = _meta_path(cache)
    if not meta_path.is_file():
        return None, f"its meta file {meta_path} is missing"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"its meta file {meta_path} is unreadable ({exc})"
    if not isinstance(meta, dict):
        return None, f"its meta file {meta_path} is unreadable (not a JSON object)"
    return meta, None


def _write_cache(cache: Path, tasks: list[WorkflowTask], fingerprint: str) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"task_id": t.task_id, "question": t.main_query, **t.metadata}, ensure_ascii=False)
        for t in tasks
    ]
    # The meta file vouches for the cache: gone while the cache changes, written once it is whole.
    _meta_path(cache).unlink(missing_ok=True)
    write_text_atomic(cache, "\n".join(lines) + "\n")
    write_json_atomic(_meta_path(cache), {"fingerprint": fingerprint, "num_tasks": len(tasks)}, indent=None)
    logger.info("generate reader: wrote %d tasks to %s", len(tasks), cache)
