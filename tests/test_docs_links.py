"""The docs stand alone: every link and anchor resolves, the site's pages link only to each other
and are all in its navigation, the README stays a front door, and every REACH_* variable is in the
configuration reference."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
README_MAX_LINES = 250

# `[text](target)` and `[text](target "title")`; images (`![alt](target)`) match too.
_INLINE_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# `[label]: target` reference definitions.
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
# Fenced code, at the margin or indented under a list item.
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_HTML_TAG = re.compile(r"</?[^>]*>")
_LINK_TEXT = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_NOT_IN_SLUG = re.compile(r"[^\w\- ]")
_REACH_NAME = re.compile(r"\bREACH_[A-Z0-9_]+\b")
# REACH_* names in src/ that are not environment variables.
NOT_ENVIRONMENT = {"REACH_ERROR"}  # the code of the base ReachError


def markdown_files() -> list[Path]:
    """README.md and every docs/*.md."""
    return [README, *sorted(DOCS.glob("*.md"))]


def without_code(text: str) -> str:
    """``text`` without fenced code and code spans, where nothing is a link or a heading."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def link_targets(text: str) -> list[str]:
    """The targets of the inline links and reference definitions in ``text``, code excluded."""
    prose = without_code(text)
    return _INLINE_LINK.findall(prose) + _REFERENCE.findall(prose)


def slug(heading: str) -> str:
    """The anchor a code host gives a heading, the one mkdocs.yml's slugify gives it too."""
    text = _LINK_TEXT.sub(r"\1", _HTML_TAG.sub("", heading)).replace("`", "")
    return _NOT_IN_SLUG.sub("", text.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """Every heading anchor of ``doc``, a repeated heading numbered as a code host numbers it."""
    found: set[str] = set()
    for _, heading in _HEADING.findall(_FENCE.sub("", doc.read_text(encoding="utf-8"))):
        base = slug(heading)
        anchor, count = base, 0
        while anchor in found:
            count += 1
            anchor = f"{base}-{count}"
        found.add(anchor)
    return found


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``doc`` that leaves ``root``, names a file that does not exist, or
    names an anchor that the Markdown file it points to does not have."""
    problems: list[str] = []
    for target in link_targets(doc.read_text(encoding="utf-8")):
        if _SCHEME.match(target):
            continue  # a URL
        path, _, anchor = target.split("?", 1)[0].partition("#")
        if path.startswith("/"):
            problems.append(f"{doc.name}: {target} is absolute; link relative to the file")
            continue
        resolved = (doc.parent / path).resolve() if path else doc.resolve()
        if not resolved.is_relative_to(root):
            problems.append(f"{doc.name}: {target} is outside the repository")
        elif not resolved.exists():
            problems.append(f"{doc.name}: {target} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{doc.name}: {target} names an anchor that {resolved.name} does not have")
    return problems


def links_out_of_the_site(doc: Path, docs: Path = DOCS) -> list[str]:
    """Each relative link of a site page that leaves the docs folder, which the site does not serve."""
    return [
        f"{doc.name}: {target} is outside docs/; name the file in code instead"
        for target in link_targets(doc.read_text(encoding="utf-8"))
        if not _SCHEME.match(target)
        and not target.startswith("#")
        and not (doc.parent / target.partition("#")[0]).resolve().is_relative_to(docs.resolve())
    ]


class _MkDocsLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, taking its Python and `!relative` tags as plain nulls."""


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> None:
    return None


_MkDocsLoader.add_multi_constructor("!", _any_tag)
_MkDocsLoader.add_multi_constructor("tag:yaml.org,2002:python/", _any_tag)


def nav_pages(entry: Any) -> list[str]:
    """Every page file named in an mkdocs ``nav`` entry, at any depth."""
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [page for item in entry for page in nav_pages(item)]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in nav_pages(value)]
    return []


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
    (repo / "docs" / "protocol.md").write_text("# p\n\n## 3. Agent profile\n")
    doc = repo / "README.md"
    doc.write_text(
        "# Usage\n"
        "[ok](docs/protocol.md#3-agent-profile) [web](https://example.com) [here](#usage)\n"
        "[out](../shared/PROTOCOL.md) [gone](docs/missing.md)\n"
        "`[code](../not/a/link.md)`\n"
        "```\n[fenced](../not/a/link.md)\n```\n"
        "  ```\n  [indented fence](../not/a/link.md)\n  ```\n"
        "[ref]: ../shared/NOTES.md\n"
    )
    assert broken_links(doc, repo) == [
        "README.md: ../shared/PROTOCOL.md is outside the repository",
        "README.md: docs/missing.md does not exist",
        "README.md: ../shared/NOTES.md is outside the repository",
    ]


def test_the_checker_catches_missing_anchors(tmp_path: Path) -> None:
    """An anchor that no heading of the target (or of the file itself) gives is reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n\n## 5. Calling: `POST /reach`\n\n## Notes\n\n## Notes\n\n```\n# not a heading\n```\n"
    )
    doc = tmp_path / "README.md"
    doc.write_text(
        "# Top\n\n## Run it — fast\n"
        "[a](docs/page.md#5-calling-post-reach) [b](docs/page.md#notes-1) [c](#run-it--fast)\n"
        "[d](docs/page.md#calling) [e](#top-1) [f](docs/page.md#not-a-heading)\n"
    )
    assert broken_links(doc, tmp_path) == [
        "README.md: docs/page.md#calling names an anchor that page.md does not have",
        "README.md: #top-1 names an anchor that README.md does not have",
        "README.md: docs/page.md#not-a-heading names an anchor that page.md does not have",
    ]


def test_slugs_are_those_of_a_code_host() -> None:
    """Headings with code, punctuation, dashes and Chinese give the anchors a code host gives."""
    assert slug("5. Calling: `POST /reach`") == "5-calling-post-reach"
    assert slug("Several Routers: the etcd registry") == "several-routers-the-etcd-registry"
    assert slug("A2A import (`reach a2a import URL`)") == "a2a-import-reach-a2a-import-url"
    assert slug("Run it — fast") == "run-it--fast"
    assert slug("价格查询 Agent") == "价格查询-agent"
    assert slug("See [the protocol](protocol.md)") == "see-the-protocol"


def test_docs_exist() -> None:
    """The protocol document the README points to is in the repository."""
    assert (DOCS / "protocol.md").is_file()
    assert "](docs/protocol.md" in README.read_text(encoding="utf-8")


def test_markdown_links_and_anchors_resolve() -> None:
    """Every relative link and #anchor in README.md and docs/*.md resolves inside the repository."""
    problems = [problem for doc in markdown_files() for problem in broken_links(doc)]
    assert not problems, "\n".join(problems)


def test_site_pages_link_only_inside_the_site(tmp_path: Path) -> None:
    """A docs page links to other docs pages only: the site serves nothing else."""
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("[in](other.md#x) [out](../src/a.py) [web](https://example.com) [here](#y)\n")
    assert links_out_of_the_site(page, tmp_path / "docs") == [
        "page.md: ../src/a.py is outside docs/; name the file in code instead"
    ]
    problems = [problem for doc in sorted(DOCS.glob("*.md")) for problem in links_out_of_the_site(doc)]
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_in_the_site_navigation() -> None:
    """Each docs/*.md is a page of mkdocs.yml's nav, and each page the nav names exists."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_MkDocsLoader)
    in_nav = nav_pages(config["nav"])
    on_disk = sorted(page.name for page in DOCS.glob("*.md"))
    assert sorted(set(on_disk) - set(in_nav)) == [], "add these pages to nav in mkdocs.yml"
    assert sorted(set(in_nav) - set(on_disk)) == [], "nav in mkdocs.yml names pages that do not exist"


def test_readme_is_a_front_door() -> None:
    """The README stays short, starts with the two commands, and installs only this project."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < README_MAX_LINES
    commands = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    assert commands is not None
    assert [line.split("#")[0].strip() for line in commands.group(1).splitlines()] == [
        "make demo",
        "make test",
    ]


def install_commands(doc: Path) -> list[str]:
    """The `pip install` lines of the fenced code in ``doc``, their comments cut off."""
    code = "\n".join(block.group(0) for block in _FENCE.finditer(doc.read_text(encoding="utf-8")))
    return [line.split("#")[0] for line in code.splitlines() if "pip install" in line.split("#")[0]]


def test_no_install_command_fetches_another_project() -> None:
    """The README says how to install this project, and no command in the docs installs
    `agent-reach` or `agent_reach`: on PyPI those names are someone else's project."""
    assert any("reachmesh" in line or "/path/to/clone" in line for line in install_commands(README))
    wrong = [
        f"{doc.name}: {line.strip()}"
        for doc in markdown_files()
        for line in install_commands(doc)
        if re.search(r"agent[-_]reach", line)
    ]
    assert not wrong, "\n".join(wrong)


def test_every_reach_variable_in_the_code_is_in_the_configuration_reference() -> None:
    """Each REACH_* name the code reads appears in docs/configuration.md."""
    reference = CONFIGURATION.read_text(encoding="utf-8")
    missing = sorted(name for name in reach_names_in_code() if not re.search(rf"\b{name}\b", reference))
    assert not missing, f"REACH_* names in src/ but not in docs/configuration.md: {missing}"


def section(text: str, heading: str) -> str:
    """The body under ``heading`` (a level-2 heading) up to the next level-2 heading."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0].strip()


def test_the_reference_session_is_the_same_in_the_readme_and_on_the_site() -> None:
    """The front door and Getting started show one reference session, links aside."""
    readme = section(README.read_text(encoding="utf-8"), "The reference session")
    site = section((DOCS / "getting-started.md").read_text(encoding="utf-8"), "The reference session")
    assert readme.replace("](docs/", "](") == site
