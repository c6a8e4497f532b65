"""Fail when two modules import each other, directly or in a circle (`make lint`): in ajet, in
scripts/, and among the modules of one tutorial example.

import-linter's layer contracts keep imports pointing down between ajet's packages; inside one
package two modules could still import each other. This builds the import graph of ajet and of
scripts with grimp (import-linter's own graph library; imports inside functions count too) and
prints every circle of modules it finds. Imports only for type checking (`if TYPE_CHECKING:`) do
not count, as for import-linter. A tutorial example is a folder of modules that import each other
by their plain names (the folder is on sys.path), which grimp cannot follow: their imports are
read from the source (with `ast`, wherever in a module they stand).

    .venv/bin/python -m scripts.tools.check_import_cycles
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grimp

from scripts.bench.common import REPO

PACKAGES = ("ajet", "scripts")


def package_imports(packages: Sequence[str] = PACKAGES) -> dict[str, list[str]]:
    """module -> the modules it imports, within `packages`."""
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=True)  # as import-linter (pyproject)
    return {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}


def example_imports(example: Path) -> dict[str, list[str]]:
    """module -> the sibling modules it imports, for the modules of one tutorial example folder."""
    modules = {p.stem: p for p in example.glob("*.py")}
    edges: dict[str, list[str]] = {}
    for name, path in sorted(modules.items()):
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                named.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named.add(node.module.split(".")[0])
        edges[name] = sorted(named & set(modules) - {name})
    return edges


def import_cycles(edges: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:  # iterative: the graph is deep enough for Python's recursion limit
        nonlocal counter
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def main() -> int:
    graphs = {", ".join(PACKAGES): package_imports()}
    graphs |= {str(p.relative_to(REPO)): example_imports(p) for p in sorted((REPO / "tutorial").glob("example_*"))}
    found = 0
    for where, edges in graphs.items():
        for cycle in import_cycles(edges):
            print(f"import circle in {where}: " + " <-> ".join(cycle))
            found += 1
    if found:
        print(f"{found} import circle(s): move what both sides need into a module both can import.")
        return 1
    print(f"no import circles in {', '.join(PACKAGES)} or the tutorial examples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
