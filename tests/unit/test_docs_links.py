"""The docs hold together: every relative markdown link in README.md, AGENTS.md, docs/ and the
tutorials' READMEs points at a file that exists (anchors are not checked), the docs index links
every page under docs/ but the history, and the two results pages stay short (issue 56 §6)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RESULTS = (DOCS / "results" / "speed.md", DOCS / "results" / "learning.md")
# [text](target) and ![alt](target); a target ends at a space (a title follows) or the bracket.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def pages() -> list[Path]:
    return sorted([REPO / "README.md", REPO / "AGENTS.md", *DOCS.rglob("*.md"),
                   *REPO.glob("tutorial/*/README.md"), REPO / "tutorial" / "README.md"])


def find_links(text: str) -> list[str]:
    text = FENCE.sub("", text)  # a code block's brackets are code, not links
    return LINK.findall(re.sub(r"`[^`\n]*`", "", text))


def links(page: Path) -> list[str]:
    return find_links(page.read_text())


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in pages():
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL (http:, mailto:) or an anchor in the page itself
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_the_link_pattern_finds_what_it_should() -> None:
    page = "[a](x.md) ![img](../img/p.png) [b](https://e.org) [c](y.md#part) `[d](no.md)`\n```\n[e](no.md)\n```\n"
    assert find_links(page) == ["x.md", "../img/p.png", "https://e.org", "y.md#part"]


def test_the_index_links_every_page_but_the_history() -> None:
    index = DOCS / "README.md"
    linked = {(index.parent / t.split("#", 1)[0]).resolve() for t in links(index)}
    unlinked = [p.relative_to(REPO) for p in sorted(DOCS.rglob("*.md"))
                if p != index and p.resolve() not in linked
                and not p.is_relative_to(DOCS / "log") and not p.is_relative_to(DOCS / "learning")]
    assert not unlinked, f"docs/README.md does not link {', '.join(map(str, unlinked))}"
    for section in ("Quick start", "Concepts", "How-to guides", "Reference", "Results"):
        assert f"\n## {section}" in index.read_text(), section


def test_the_results_pages_are_short() -> None:
    lines = sum(len(p.read_text().splitlines()) for p in RESULTS)
    assert lines < 400, f"docs/results/speed.md and learning.md: {lines} lines (issue 56 §6: under 400)"
