"""docs/layout.md names every module under src/reachmesh once, and nothing that is not there."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "reachmesh"
LAYOUT = ROOT / "docs" / "layout.md"


def named_in_layout() -> list[str]:
    """The paths the layout's tree names (relative to src/reachmesh/), from its indentation:
    two spaces per folder, a folder ending in "/", the first word of a line its name."""
    text = LAYOUT.read_text(encoding="utf-8")
    start = text.index("```\nsrc/reachmesh/\n") + len("```\nsrc/reachmesh/\n")
    block = text[start : text.index("```", start)]
    folders: list[str] = []
    named: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0 and indent >= 2, f"docs/layout.md: odd indentation: {line!r}"
        depth = indent // 2 - 1
        assert depth <= len(folders), f"docs/layout.md: indented past its folder: {line!r}"
        del folders[depth:]
        name = line.split()[0]
        path = "/".join([*folders, name])
        named.append(path)
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return named


def test_the_layout_names_every_module_once_and_nothing_else() -> None:
    named = named_in_layout()
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    files = {p for p in named if not p.endswith("/")}
    missing = sorted(modules - files)
    extra = sorted(p for p in named if not (PACKAGE / p).exists())
    twice = sorted(p for p, n in Counter(named).items() if n > 1)
    problems = []
    if missing:
        problems.append("modules in src/reachmesh/ that docs/layout.md does not name: " + ", ".join(missing))
    if extra:
        problems.append("names in docs/layout.md that are not in src/reachmesh/: " + ", ".join(extra))
    if twice:
        problems.append("named more than once in docs/layout.md: " + ", ".join(twice))
    assert not problems, "\n".join(problems) + "\n(one line per module, indented two spaces per folder)"


def test_only_the_layout_page_draws_the_tree() -> None:
    """One description: the architecture page points to it instead of keeping its own."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page != LAYOUT:
            assert "src/reachmesh/\n  " not in page.read_text(encoding="utf-8"), (
                f"{page.name} draws the tree too"
            )
