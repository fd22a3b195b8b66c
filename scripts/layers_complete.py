"""Fail when a top-level module or subpackage of reachmesh sits in no layer.

import-linter checks the imports between the layers it is given, and says nothing of a module
left out of them: a new module would otherwise be free to import anything. The package root
(``__init__``, the lazy public API) and ``__main__`` (the entry point) are the two exceptions.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXEMPT = {"__init__", "__main__"}


def layered(pyproject: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for contract in pyproject["tool"]["importlinter"]["contracts"]:
        if contract.get("type") == "layers" and contract.get("containers") == ["reachmesh"]:
            for layer in contract["layers"]:
                names.update(part.strip() for part in layer.split("|"))
    return names


def modules(package: Path) -> set[str]:
    found = {p.stem for p in package.glob("*.py")}
    found |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return found - EXEMPT


def main() -> int:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    missing = sorted(modules(ROOT / "src" / "reachmesh") - layered(pyproject))
    if missing:
        print(f"in no layer of pyproject.toml's layers contract: {', '.join(missing)}")
        return 1
    print("every reachmesh module sits in a layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
