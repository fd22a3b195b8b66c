"""Fail when a function in src/ is over 60 lines or a class over 400.

Long functions and classes hide more than one job. The few that are still over the limit are
named in KNOWN with their size today: they may shrink, never grow, and a new one fails. Data
literals (OpenAPI tables, say) belong in module constants, which this does not measure.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION = 60
MAX_CLASS = 400

# (path under src/, qualified name) -> lines today. Remove an entry once it is under the limit.
KNOWN: dict[tuple[str, str], int] = {}


def oversized(path: Path, relative: str) -> list[tuple[str, str, int, int]]:
    """(relative path, qualified name, lines, limit) of each definition over its limit."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                limit = MAX_CLASS if isinstance(child, ast.ClassDef) else MAX_FUNCTION
                if lines > limit:
                    found.append((relative, name, lines, limit))
                walk(child, f"{name}.")

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def main() -> int:
    failures = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        relative = path.relative_to(ROOT / "src").as_posix()
        for where, name, lines, limit in oversized(path, relative):
            known = KNOWN.get((where, name))
            if known is None or lines > known:
                known_text = "-" if known is None else str(known)
                failures.append(f"{where}: {name} is {lines} lines (limit {limit}; known {known_text})")
    for line in failures:
        print(line)
    if failures:
        return 1
    print(
        f"no function over {MAX_FUNCTION} lines and no class over {MAX_CLASS} in src/ (known: {len(KNOWN)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
