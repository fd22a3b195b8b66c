"""``reach drill --router`` against a hostile Router: what it prints, writes and waits for is bounded."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from reachmesh.cli.drill.fleet import Fleet
from reachmesh.cli.drill.report import markdown
from reachmesh.cli.drill.scenarios import MAX_OPEN_SECONDS, Settings, Stage, breaker_plan

SCRIPT = "<script>alert(1)</script>"
ESC = "\x1b]0;owned\x07\x1b[2J"


def hostile_report() -> dict[str, Any]:
    return {
        "router": {"url": "http://127.0.0.1:9", "started": f"given {SCRIPT}", "version": f"9{ESC}{SCRIPT}"},
        "ok": False,
        "scenarios": {
            "breaker": {
                "ok": False,
                "router": {
                    "url": "http://127.0.0.1:9/|<b>x</b>",
                    "policy": {"breaker": {"open_seconds": "1\n```\n<img src=x onerror=alert(1)>"}},
                },
                "figures": {
                    "agent": f"evil|{SCRIPT}{ESC}",
                    "seen": {"id": "[click](javascript:alert(1))"},
                    "rows": [{"id": "**bold** | forged cell", "n": 1}],
                },
                "promises": [
                    {"name": "the breaker opened", "ok": False, "detail": "| yes | forged |\n## heading"}
                ],
                "marks": [{"atS": 1.0, "label": "_fault_ <i>x</i>"}],
                "timeline": [],
            }
        },
    }


def unfenced(text: str) -> list[str]:
    """The lines of ``text`` outside its ``` fences (which render nothing)."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if not inside:
            lines.append(line)
    return lines


def test_report_md_escapes_markdown_html_and_control_characters_from_the_router() -> None:
    """No tag, link, control character, forged table cell or heading from the Router's words
    reaches report.md as anything but text; the policy stays inside its one fence."""
    text = markdown(hostile_report(), {})
    assert "\x1b" not in text and "\x07" not in text
    assert [line for line in text.splitlines() if line.startswith("```")] == ["```json", "```"]
    # What Markdown reads as markup: the text outside fences, backslash-escaped characters gone.
    outside = re.sub(r"\\.", "", "\n".join(unfenced(text)))
    for live in ("<script", "<img", "<b>", "<i>", "](javascript", "**bold**", "\n## heading"):
        assert live not in outside, live
    promise_row = next(line for line in unfenced(text) if line.startswith("| the breaker opened"))
    assert promise_row.replace("\\|", "").count("|") == 4, promise_row
    rows = [line for line in unfenced(text) if "forged cell" in line]
    assert rows and all(row.replace("\\|", "").count("|") == 3 for row in rows), rows


def stage(policy: dict[str, Any] | None) -> Stage:
    fleet = Fleet("http://127.0.0.1:9", None, Path("."))
    return Stage("http://127.0.0.1:9", None, fleet, Settings(duration=15), policy)


def test_a_hostile_breaker_policy_is_clamped_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    """open_seconds 1e9 made the breaker drill run for 1e9 s: it is clamped to 300, a threshold
    that is not a number is the default, and both are said on stderr and kept in the figures."""
    run = stage({"breaker": {"open_seconds": 1e9, "failure_threshold": "lots"}})
    threshold, open_seconds, duration = breaker_plan(run)
    assert (threshold, open_seconds) == (5, MAX_OPEN_SECONDS)
    assert duration == 1.0 + 3.0 + MAX_OPEN_SECONDS + 4.0
    said = capsys.readouterr().err
    assert "breaker.open_seconds of 1000000000.0" in said and "breaker.failure_threshold of 'lots'" in said
    assert len(run.clamped) == 2
    for odd in (float("nan"), True, None, -5):
        assert breaker_plan(stage({"breaker": {"open_seconds": odd}}))[1] in (10, 0.001)
    assert breaker_plan(stage({"breaker": {"open_seconds": 2}}))[1:] == (2.0, 15)
    assert breaker_plan(stage(None))[:2] == (5, 10)


class _Listing(BaseHTTPRequestHandler):
    rows: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        body = json.dumps(self.rows).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hostile_router() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_agent_ids_a_router_lists_carry_no_terminal_control_sequences(
    hostile_router: str, tmp_path: Path
) -> None:
    """The ids the drill prints after cleanup (its own prefix, then whatever the Router adds)
    have their control characters escaped and are cut to a bound."""
    fleet = Fleet(hostile_router, None, tmp_path)
    _Listing.rows = [{"id": f"{fleet.prefix}0{ESC}"}, {"id": fleet.prefix + "x" * 5000}, {"id": "other"}]
    left = fleet.cleanup()
    assert left is not None and len(left) == 2
    assert all("\x1b" not in row and "\x07" not in row and len(row) <= 161 for row in left)
    assert left[0].startswith(f"{fleet.prefix}0\\x1b")
