"""scripts/tools/check_import_cycles.py (`make lint`): a circle of imports is found in a package
graph and among a tutorial example's modules, wherever in a module the import stands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def check(script: Any) -> Any:
    return script("tools.check_import_cycles")


def test_a_circle_between_an_examples_modules_is_found(check: Any, tmp_path: Path) -> None:
    (tmp_path / "make_data.py").write_text("import json\n\n\ndef main():\n    import make_demos\n")
    (tmp_path / "make_demos.py").write_text("from make_data import rows\nimport game\n")
    (tmp_path / "game.py").write_text("from collections import Counter\n")
    edges = check.example_imports(tmp_path)
    assert edges == {"game": [], "make_data": ["make_demos"], "make_demos": ["game", "make_data"]}
    assert check.import_cycles(edges) == [["make_data", "make_demos"]]
    (tmp_path / "make_demos.py").write_text("import game\n")
    assert check.import_cycles(check.example_imports(tmp_path)) == []


def test_longer_circles_are_one_component(check: Any) -> None:
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []}
    assert check.import_cycles(edges) == [["a", "b", "c"]]
