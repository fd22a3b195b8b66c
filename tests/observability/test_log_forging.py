"""No caller or agent text forges a log line or puts a raw control byte in the log or ``reach trace``."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import httpx
import pytest
from rich.console import Console

from reachmesh.cli.timeline import render_trace
from reachmesh.config import RouterConfig
from reachmesh.observability import logging as reach_logging
from reachmesh.testing import FakeAgent, RouterServer

FORGED = "2026-11-30T00:00:00.000Z INFO [registry] deregistered agent-alpha"
ESC = "\x1b[2J\x1b[31m"


@pytest.fixture
def log_buffer() -> Iterator[io.StringIO]:
    """The Router's own text log set up on a buffer; the global logging state restored after."""
    buffer = io.StringIO()
    root = logging.getLogger("reachmesh")
    saved = (root.level, root.propagate, list(root.handlers), reach_logging._handler, reach_logging._format)
    reach_logging._handler = None
    reach_logging.configure("INFO", "text", stream=buffer)
    try:
        yield buffer
    finally:
        flush_log()
        root.setLevel(saved[0])
        root.propagate = saved[1]
        root.handlers[:] = saved[2]
        reach_logging._handler, reach_logging._format = saved[3], saved[4]


def flush_log() -> None:
    """Write the trace lines batched for the end of this turn of the event loop."""
    for handler in logging.getLogger("reachmesh").handlers:
        handler.flush()


def assert_clean(text: str) -> None:
    """No line of ``text`` is the forged one, and no control character but the newline is in it."""
    assert not any(line.lstrip(" │├└─").startswith(FORGED[:24]) for line in text.splitlines()), text
    assert all(ch == "\n" or ch.isprintable() for ch in text), [ch for ch in text if not ch.isprintable()][:5]


async def test_payload_keys_and_agent_errors_cannot_forge_lines(log_buffer: io.StringIO) -> None:
    """A payload key echoed in "invalid request", and an agent's error message, each carrying a
    newline, a forged INFO line and terminal escapes: one escaped line each in the log and in the
    trace timeline; the healthy caller is served meanwhile."""
    config = RouterConfig.from_mapping(
        {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}
    )
    # Every key must hold an integer: the refusal names the offending key as payload.<key>.
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        strict = FakeAgent("strict", tasks=("strict",), input_schema=schema)
        liar = FakeAgent("liar", tasks=("lie",))
        liar.raw_answer = (
            '{"status":"AGENT_ERROR","error":{"code":"X","message":"no\\n' + FORGED + '\\u001b[2J"}}'
        ).encode()
        healthy = FakeAgent("healthy", tasks=("echo",))
        for agent in (strict, liar, healthy):
            await agent.start()
            await agent.register(router.url, vectors=False)
        try:
            bad = {"traceId": "forge-key", "targetTask": "strict", "payload": {f"k\n{FORGED}{ESC}": "x"}}
            resp = await http.post("/reach", json=bad)
            assert resp.json()["status"] == "INVALID_REQUEST"
            resp = await http.post("/reach", json={"traceId": "forge-agent", "targetTask": "lie"})
            assert resp.json()["status"] == "AGENT_ERROR"
            resp = await http.post("/reach", json={"targetTask": "echo", "payload": {"x": 1}})
            assert resp.json()["status"] == "SUCCESS"
            timelines = []
            for trace_id in ("forge-key", "forge-agent"):
                trace = (await http.get(f"/admin/traces/{trace_id}")).json()
                console = Console(file=io.StringIO(), width=400, color_system=None, force_terminal=False)
                console.print(render_trace(trace))
                timelines.append(console.file.getvalue())  # type: ignore[attr-defined]
        finally:
            for agent in (strict, liar, healthy):
                await agent.stop()
    flush_log()
    logged = log_buffer.getvalue()
    assert_clean(logged)
    assert f"\\n{FORGED}\\x1b[2J" in logged  # the key is there, escaped, inside its own line
    assert f"\\n{FORGED}\\x1b[2J" in timelines[0]
    for timeline in timelines:
        assert_clean(timeline)


def test_log_arguments_are_escaped_keys_and_reprs_included(log_buffer: io.StringIO) -> None:
    """Any ``%s`` or ``%r`` argument is escaped by the formatter, whatever module logs it."""
    log = logging.getLogger("reachmesh.registry")
    log.info("[registry] %s %s", "registered", f"evil\n{FORGED}{ESC}")
    log.warning("key %r refused", {f"k\n{FORGED}": ESC})
    flush_log()
    text = log_buffer.getvalue()
    assert len(text.splitlines()) == 2
    assert_clean(text)
    assert text.count(FORGED) == 2


@pytest.fixture
def root_log_buffer() -> Iterator[io.StringIO]:
    """The entry point's set-up (``take_root``) on a buffer; the root logger restored after."""
    buffer = io.StringIO()
    root, ours = logging.getLogger(), logging.getLogger("reachmesh")
    saved = (list(root.handlers), ours.level, ours.propagate, list(ours.handlers))
    saved_module = (reach_logging._handler, reach_logging._format)
    reach_logging._handler = None
    reach_logging.configure("INFO", "text", stream=buffer, take_root=True)
    try:
        yield buffer
    finally:
        flush_log()
        root.handlers[:] = saved[0]
        ours.setLevel(saved[1])
        ours.propagate = saved[2]
        ours.handlers[:] = saved[3]
        reach_logging._handler, reach_logging._format = saved_module


def test_another_librarys_logger_cannot_forge_a_line(root_log_buffer: io.StringIO) -> None:
    """A third-party logger (a2a-sdk's name) writing a caller's text into its message, by ``%s``,
    by an f-string and in an exception: each record is one escaped line (tracebacks keep their
    lines, each with the prefix), named by its logger; no raw control byte gets through."""
    log = logging.getLogger("a2a.server.routes.common")
    evil = f"x\n{FORGED}{ESC}"
    log.warning("Request error: Message='Task %s not found'", evil)
    log.error(f"Request error: Message='Task {evil} not found'")
    try:
        raise ValueError(f"Task {evil} not found")
    except ValueError:
        log.exception("Failed to parse request params")
    flush_log()
    text = root_log_buffer.getvalue()
    assert_clean(text)
    lines = text.splitlines()
    shown = (
        "Request error: Message='Task x\\n" + FORGED + ESC.encode("unicode_escape").decode() + " not found'"
    )
    assert lines[0].endswith("WARNING [a2a.server.routes.common] " + shown), lines[0]
    assert lines[1].endswith("ERROR [a2a.server.routes.common] " + shown), lines[1]
    # Every line of the traceback carries the record's own prefix: the exception's message
    # cannot begin a line.
    assert all(line[:24] != FORGED[:24] and line[24:31] == " ERROR " for line in lines[2:]), lines[2:]
    assert any("Traceback (most recent call last):" in line for line in lines[2:])


def test_json_logs_of_another_library_are_one_object_each(root_log_buffer: io.StringIO) -> None:
    """In JSON, a foreign record is one object with its logger named; its text escaped."""
    reach_logging.configure("INFO", "json", stream=root_log_buffer, take_root=True)
    logging.getLogger("a2a.client").warning("Task %s", f"x\n{FORGED}{ESC}")
    flush_log()
    text = root_log_buffer.getvalue()
    assert len(text.splitlines()) == 1
    assert '"logger":"a2a.client"' in text and "\\\\x1b" in text
