"""Fail when two of ajet's modules import each other, directly or in a circle (`make lint`).

import-linter's layer contracts keep imports pointing down between packages; inside one
package two modules could still import each other. This builds the import graph with grimp
(import-linter's own graph library; imports inside functions count too) and prints every
circle of modules it finds. Imports only for type checking (`if TYPE_CHECKING:`) do not count, as
for import-linter.
"""

from __future__ import annotations

import sys

import grimp


def import_cycles(package: str = "ajet") -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)  # as import-linter (pyproject)
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
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

    for module in modules:
        if module not in index:
            visit(module)
    return cycles


def main() -> int:
    cycles = import_cycles()
    for cycle in cycles:
        print("import circle: " + " <-> ".join(cycle))
    if cycles:
        print(f"{len(cycles)} import circle(s) in ajet: move what both sides need into a module both can import.")
        return 1
    print("no import circles in ajet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
