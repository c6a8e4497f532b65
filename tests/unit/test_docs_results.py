"""docs/results/learning.md's tables are what scripts/docs_results.py builds from the committed
benchmark JSON: a figure cannot drift from its run, and each row names the command that reruns it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def gen(script: Any) -> Any:
    return script("docs_results")


@pytest.fixture
def blocks(script: Any) -> Any:
    return script("docs_blocks")


def test_the_committed_page_holds_the_tables_built_now(gen: Any, blocks: Any) -> None:
    for page, generated in gen.blocks().items():
        text = page.read_text()
        assert blocks.fill(text, gen.SCRIPT, generated) == text, (
            f"{page.relative_to(REPO)} is stale: run .venv/bin/python scripts/docs_results.py")


def test_every_table_row_names_its_command_date_and_cpu(gen: Any) -> None:
    for generated in gen.blocks().values():
        for key, body in generated.items():
            rows = [line for line in body.splitlines() if line.startswith("| ") and "---|" not in line][1:]
            assert rows, key
            for row in rows:
                cells = [c.strip() for c in row.strip("|").split("|")]
                assert cells[-1].startswith("`.venv/bin/python scripts/") and cells[-1].endswith("`"), row
                assert cells[-2][:4] == "2026" or cells[-2] == "not recorded", row  # the date
                assert any(isa in cells[-3] for isa in ("AMX", "AVX-512", "AVX2", "not recorded")), row


def test_each_learning_run_shows_its_json_figures(gen: Any) -> None:
    """Every run of a registry example, from every committed bench_learning.json, is a row with
    its own base -> trained, minutes and machine."""
    body = gen.blocks()[gen.PAGE]["bench_learning"]
    registry = {e.name for e in gen.REGISTRY}
    seen = 0
    for path in gen.sources("bench_learning.json"):
        for r in json.loads(path.read_text())["results"].values():
            if gen.base_name(r["name"]) not in registry:
                assert r["name"] in body  # named as no longer in the registry
                continue
            m = r["machine"]
            want = (f"{gen.fmt(r['base'])}", f"-> {gen.fmt(r['trained'])}", f"| {r['minutes']:.1f} (",
                    gen.cpu(m["cpu"], m["avx"]), r["date"][:10])
            assert any(all(w in line for w in want) for line in body.splitlines()), (r["name"], want)
            seen += 1
    assert seen >= 20


def test_check_fails_on_a_stale_page_and_a_run_rewrites_it(gen: Any, blocks: Any, tmp_path: Path) -> None:
    page = tmp_path / "learning.md"
    text = gen.PAGE.read_text()
    page.write_text(text.replace("| adder |", "| adder (edited) |", 1))
    pages = {page: gen.blocks()[gen.PAGE]}
    assert blocks.run(pages, gen.SCRIPT, ["--check"], tmp_path) == 1
    assert blocks.run(pages, gen.SCRIPT, [], tmp_path) == 0
    assert page.read_text() == text
    assert blocks.run(pages, gen.SCRIPT, ["--check"], tmp_path) == 0


def test_a_missing_or_doubled_marker_is_an_error(blocks: Any) -> None:
    start = blocks.begin("x.py", "k")
    with pytest.raises(ValueError, match="once"):
        blocks.fill("no markers", "x.py", {"k": "body"})
    with pytest.raises(ValueError, match="once"):
        blocks.fill(f"{start}\n{blocks.END}\n{start}\n{blocks.END}", "x.py", {"k": "body"})
    with pytest.raises(ValueError, match="no"):
        blocks.fill(f"{start}\nbody", "x.py", {"k": "body"})
    assert blocks.fill(f"a\n{start}\nold\n{blocks.END}\nb", "x.py", {"k": "new"}) == f"a\n{start}\nnew\n{blocks.END}\nb"


def test_cpu_labels_name_the_widest_instruction_set(gen: Any) -> None:
    assert gen.cpu("Intel(R) Xeon(R) Processor", ["avx2", "avx512f", "avx512_bf16", "amx_tile"]) == "Intel Xeon, AMX"
    assert gen.cpu("AMD EPYC", ["avx2", "avx512f", "avx512_bf16"]) == "AMD EPYC, AVX-512 + avx512_bf16"
    assert gen.cpu("AMD EPYC 7B13", ["avx", "avx2"]) == "AMD EPYC 7B13, AVX2 only"
    assert gen.cpu("", []) == "CPU model not recorded, flags not recorded"
