"""The site's own settings make a broken link or anchor fail `mkdocs build --strict`, as CI runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mkdocs", reason="the site is built with the dev extras' mkdocs")


def build(tmp_path: Path, page: str) -> subprocess.CompletedProcess[str]:
    """Build a two-page site with the repository's mkdocs.yml settings, its nav cut to the two."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = re.sub(r"(?ms)^nav:\n.*\Z", "nav:\n  - Home: index.md\n  - Other: other.md\n", config)
    (tmp_path / "mkdocs.yml").write_text(config, encoding="utf-8")
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## 5. Calling: `POST /reach`\n", encoding="utf-8")
    (tmp_path / "docs" / "index.md").write_text(page, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_a_good_link_and_anchor_build(tmp_path: Path) -> None:
    """The positive control: a link to a heading as a code host slugs it builds."""
    done = build(tmp_path, "# Home\n\n[call](other.md#5-calling-post-reach)\n")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "other" / "index.html").is_file()


def test_broken_links_and_anchors_fail_the_strict_build(tmp_path: Path) -> None:
    """A link to a missing page, to a missing anchor of another page, or to a missing anchor of the
    page itself is a warning each, and --strict makes the build fail on them."""
    done = build(tmp_path, "# Home\n\n[call](other.md#calling) [gone](missing.md) [here](#nowhere)\n")
    assert done.returncode != 0
    for complaint in ("does not contain an anchor '#calling'", "'missing.md', but the target", "'#nowhere'"):
        assert complaint in done.stderr, done.stderr
