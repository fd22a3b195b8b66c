"""The docs stand alone: links stay in the repository, and every REACH_* variable is in the README."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# `[text](target)` and `[text](target "title")`; images (`![alt](target)`) match too.
_INLINE_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# `[label]: target` reference definitions.
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_REACH_NAME = re.compile(r"\bREACH_[A-Z0-9_]+\b")
# REACH_* names in src/ that are not environment variables.
NOT_ENVIRONMENT = {"REACH_ERROR"}  # the code of the base ReachError


def markdown_files() -> list[Path]:
    """README.md and every docs/*.md."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def link_targets(text: str) -> list[str]:
    """The targets of the inline links and reference definitions in ``text``, code excluded."""
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    return _INLINE_LINK.findall(prose) + _REFERENCE.findall(prose)


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``doc`` that leaves ``root`` or names a file that does not exist."""
    problems: list[str] = []
    for target in link_targets(doc.read_text(encoding="utf-8")):
        if _SCHEME.match(target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same file
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path.startswith("/"):
            problems.append(f"{doc.name}: {target} is absolute; link relative to the file")
            continue
        resolved = (doc.parent / path).resolve()
        if not resolved.is_relative_to(root):
            problems.append(f"{doc.name}: {target} is outside the repository")
        elif not resolved.exists():
            problems.append(f"{doc.name}: {target} does not exist")
    return problems


def reach_names_in_code() -> set[str]:
    """Every REACH_* name in src/, except those that are not environment variables."""
    found: set[str] = set()
    for source in (ROOT / "src").rglob("*.py"):
        found.update(_REACH_NAME.findall(source.read_text(encoding="utf-8")))
    return found - NOT_ENVIRONMENT


def test_the_checker_catches_outside_and_missing_links(tmp_path: Path) -> None:
    """A link out of the repository and a link to a missing file are both reported."""
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "protocol.md").write_text("# p\n")
    doc = repo / "README.md"
    doc.write_text(
        "[ok](docs/protocol.md#3-agent-profile) [web](https://example.com) [here](#usage)\n"
        "[out](../shared/PROTOCOL.md) [gone](docs/missing.md)\n"
        "`[code](../not/a/link.md)`\n"
        "```\n[fenced](../not/a/link.md)\n```\n"
        "[ref]: ../shared/NOTES.md\n"
    )
    assert broken_links(doc, repo) == [
        "README.md: ../shared/PROTOCOL.md is outside the repository",
        "README.md: docs/missing.md does not exist",
        "README.md: ../shared/NOTES.md is outside the repository",
    ]


def test_docs_exist() -> None:
    """The protocol document the README points to is in the repository."""
    assert (ROOT / "docs" / "protocol.md").is_file()
    assert "](docs/protocol.md" in README.read_text(encoding="utf-8")


def test_markdown_links_stay_inside_the_repository() -> None:
    """README.md and docs/*.md link only to files that exist inside the repository."""
    problems = [problem for doc in markdown_files() for problem in broken_links(doc)]
    assert not problems, "\n".join(problems)


def test_every_reach_variable_in_the_code_is_in_the_readme() -> None:
    """Each REACH_* name the code reads appears in README.md."""
    readme = README.read_text(encoding="utf-8")
    missing = sorted(name for name in reach_names_in_code() if not re.search(rf"\b{name}\b", readme))
    assert not missing, f"REACH_* names in src/ but not in README.md: {missing}"
