"""Names that cost a reader (#37.9): two modules a reader would mistake for each other.

Each rule below failed on the tree before the renames (``router/`` beside ``routing/``, two
``answer.py``, three ``health.py``, ``record.py`` beside ``records.py``, two ``shared.py``, two
``Watcher`` classes, a top-level ``secrets.py`` under the standard library's name).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "reachmesh"

# Class names that two modules still share today, each a different thing in its own layer (a
# transport's Answer and the fake's). They may go, never grow: a new shared name fails.
KNOWN_SHARED_CLASSES = {"Answer", "Calibration", "Job", "PoolTimeout"}

# Names that say nothing of which part they belong to: at most one module may carry each.
VAGUE = ("answer.py", "health.py", "shared.py", "common.py", "utils.py", "helpers.py")


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_top_level_module_takes_a_standard_library_name() -> None:
    """``import reachmesh.secrets`` read as the standard library's ``secrets`` in a traceback."""
    clashes = [p.name for p in SRC.glob("*.py") if p.stem in sys.stdlib_module_names]
    assert clashes == []


def test_no_two_sibling_packages_share_a_stem() -> None:
    """``router/`` beside ``routing/``: which one routes?"""
    clashes = []
    for folder in [SRC, *(p for p in SRC.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        names = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__")
        clashes += [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if a[:4] == b[:4]]
    assert clashes == []


def test_no_module_beside_its_own_plural() -> None:
    """``record.py`` and ``records.py`` in one tree are two different things."""
    stems = {p.stem for p in _modules()}
    assert sorted(s for s in stems if f"{s}s" in stems) == []


def test_a_vague_module_name_is_used_once_at_most() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        if path.name in VAGUE:
            seen[path.name].append(str(path.relative_to(SRC)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def test_no_new_class_name_is_defined_in_two_modules() -> None:
    defined: dict[str, set[str]] = defaultdict(set)
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                defined[node.name].add(str(path.relative_to(SRC)))
    shared = {name for name, where in defined.items() if len(where) > 1}
    assert shared - KNOWN_SHARED_CLASSES == set(), {n: sorted(defined[n]) for n in shared}
