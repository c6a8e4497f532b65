"""What several benchmarks share, and the tools that report on them: where the repository is and
how a child process imports it, the machine a figure was measured on, the chat prompts the decode
benchmarks generate from, a tiny random model, the files a run leaves, and the tables and plots
they print and write.

Standard library only at import: torch, transformers, rich and matplotlib are imported inside the
functions that need them, so that a bench's `--help` and the docs generators stay light.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The CLI in a child process: `[*AJET, "--conf", ...]`.
AJET = (sys.executable, "-m", "ajet.cli.main")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (plus `extra`): a child
    process (the CLI, a tutorial's client, a bench's own re-run) imports ajet, `tutorial` and
    `scripts` from this checkout, whatever its working directory."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


# ---------------------------------------------------------------------- the machine


def _cpuinfo() -> tuple[str, set[str]]:
    """(the model name, the flags) of /proc/cpuinfo's first processor; ("", set()) without one."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "", set()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    return model, flags


def cpu_model() -> str:
    return _cpuinfo()[0]


def cpu_flags() -> set[str]:
    return _cpuinfo()[1]


def vector_flags() -> list[str]:
    """The CPU's AVX and AMX flags, sorted: what a speed figure depends on."""
    return sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))


def machine() -> dict[str, Any]:
    """What a figure was measured on: the CPU, its cores, its AVX and AMX flags (key "avx") and
    the load average (other jobs on a shared machine)."""
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "avx": vector_flags(), "load_average": load}


# Per instruction-set cap: the environment variables that make ATen's dispatch, oneDNN, MKL and
# FBGEMM pick no wider kernels. Each library reads its variable once, at load or first use.
CPU_ISA = {
    "native": {},
    "avx512_bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},  # AVX-512 and avx512_bf16, no AMX
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"},
}


# ---------------------------------------------------------------------- prompts and models


QUESTIONS = [
    "What is 2+3?",
    "Name the capital of France.",
    "Write a haiku about rain.",
    "Explain photosynthesis in one paragraph.",
    "List three prime numbers greater than 10.",
    "What is the boiling point of water at sea level?",
    "Summarise the plot of Romeo and Juliet.",
    "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Give me a tip for learning Python.",
    "What is 12 times 12?",
    "Describe a cat to someone who has never seen one.",
    "What does CPU stand for?",
    "Suggest a name for a bakery.",
    "What year did the first moon landing happen?",
]


def chat_prompts(tokenizer, count: int) -> list[list[int]]:  # noqa: ANN001 - a transformers tokenizer
    """`count` one-question chat prompts as token ids (QUESTIONS in turn, numbered once they repeat)."""
    from ajet.engine.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    questions = [
        QUESTIONS[i % len(QUESTIONS)] + (f" (#{i})" if i >= len(QUESTIONS) else "")
        for i in range(count)
    ]
    return [chat.encode(chat.render([{"role": "user", "content": q}])) for q in questions]


def tiny_model(out: Path) -> Path:
    """A 2-layer random Llama with the bundled model's tokenizer (as tests/conftest.py's
    tiny_model_dir), written to `out` unless it is there: the engine is then fast, so the figures
    show what is around it (the episode API, a chaos run)."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ajet.models.resolve import bundled_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(bundled_checkpoint())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# ---------------------------------------------------------------------- what a run leaves


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (metrics.jsonl, a split), blank lines skipped."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_metric(report: Path, key: str = "success/rate") -> float:
    """A metric of an `ajet eval` report (RUN/eval/eval_NAME.json)."""
    return float(json.loads(report.read_text())["metrics"][key])


# ---------------------------------------------------------------------- tables and plots


def fmt(value: object, digits: int = 3) -> str:
    """A figure with `digits` decimals; "—" for one that was not measured (None)."""
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "—"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """The lines of a markdown table; the columns numbered in `right` are aligned right."""
    rule = "|" + "".join("---:|" if i in right else "---|" for i in range(len(headers)))
    return ["| " + " | ".join(headers) + " |", rule, *("| " + " | ".join(row) + " |" for row in rows)]


def print_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[str]], *, min_width: int = 150,
                right: bool = False, fold: bool = False) -> None:
    """A rich table on the terminal, at least `min_width` characters wide so that a row stays on
    one line in a log file too; `right`: every column but the first aligned right; `fold`: long
    words broken over lines instead of cut."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if right and i else "left",
                         overflow="fold" if fold else "ellipsis")
    for row in rows:
        table.add_row(*row)
    Console(width=max(Console().width, min_width)).print(table)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: the figures go to files, never to a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay out `fig`, write it to `path` (PNG, 100 dpi) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
