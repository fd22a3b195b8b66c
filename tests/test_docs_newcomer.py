"""What a newcomer reads first holds: the extras list, `reach demo` in the install section, and
an etcd line that starts etcd."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import httpx
import pytest

from reachmesh.ports import free_port
from tests.procs import wait_for

ROOT = Path(__file__).resolve().parent.parent


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


@pytest.mark.parametrize(
    ("page", "heading"),
    [("README.md", "## Install it outside make"), ("docs/getting-started.md", "## Install it outside make")],
)
def test_the_install_section_lists_every_extra_and_says_reach_demo(page: str, heading: str) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    text = section((ROOT / page).read_text(), heading)
    listed = set(re.findall(r"\[(\w+)\]", text))
    missing = sorted(set(extras) - {"dev"} - listed)
    assert missing == [], f"{page}: the extras list omits {missing}"
    assert "reach demo" in text, f"{page}: the install section never says how to try it (reach demo)"


def etcd_line() -> list[str]:
    """The command line docs/etcd.md gives to start etcd (joined across its backslashes)."""
    text = (ROOT / "docs" / "etcd.md").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("etcd "):
            return shlex.split(line.split("&")[0])
    raise AssertionError("docs/etcd.md gives no line that starts etcd")


@pytest.mark.etcd
def test_the_etcd_page_gives_a_line_that_starts_etcd(tmp_path: Path) -> None:
    """Run as written, on a free port and a fresh folder instead of 2379 and /tmp."""
    port = free_port()
    args = [
        a.replace("2379", str(port)).replace("/tmp/reach-etcd", str(tmp_path / "etcd")) for a in etcd_line()
    ]
    # Its peer port must not collide with another etcd on this machine either.
    args += ["--listen-peer-urls", f"http://127.0.0.1:{free_port()}"]
    log = (tmp_path / "etcd.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _healthy(port), timeout=20, what="etcd started as docs/etcd.md says")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _healthy(port: int) -> bool:
    try:
        return bool(httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json().get("health") == "true")
    except (httpx.HTTPError, ValueError):
        return False
