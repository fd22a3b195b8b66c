"""Fail when any two modules of reachmesh import each other, directly or round a loop.

import-linter's layer contracts work between packages; this looks at every module, and counts
deferred imports (inside functions or under TYPE_CHECKING) as imports too, because a circle that
only closes at run time is still a circle.
"""

from __future__ import annotations

import sys

import grimp


def cycles(package: str) -> list[list[str]]:
    """The strongly connected components of more than one module."""
    graph = grimp.build_graph(package)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    return [sorted(c) for c in _Tarjan(edges).components() if len(c) > 1]


class _Tarjan:
    """Tarjan's strongly connected components; the module graph is small, so recursion is fine."""

    def __init__(self, edges: dict[str, list[str]]) -> None:
        self.edges = edges
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.found: list[list[str]] = []

    def components(self) -> list[list[str]]:
        for node in sorted(self.edges):
            if node not in self.index:
                self._visit(node)
        return self.found

    def _visit(self, node: str) -> None:
        self.index[node] = self.low[node] = len(self.index)
        self.stack.append(node)
        for child in self.edges.get(node, []):
            if child not in self.index:
                self._visit(child)
                self.low[node] = min(self.low[node], self.low[child])
            elif child in self.stack:
                self.low[node] = min(self.low[node], self.index[child])
        if self.low[node] == self.index[node]:
            component = []
            while True:
                member = self.stack.pop()
                component.append(member)
                if member == node:
                    break
            self.found.append(component)


def main() -> int:
    found = cycles("reachmesh")
    for component in found:
        print("import circle: " + " <-> ".join(component))
    if not found:
        print("no import circles between reachmesh modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
