"""The Router's log output: the fast path writes exactly what the logging path would."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from reachmesh.decision import AttemptRecord, DecisionRecord
from reachmesh.exceptions import MAX_CANDIDATES_SHOWN
from reachmesh.observability import logging as reach_logging
from reachmesh.protocol import Status
from reachmesh.redaction import loggable


def record() -> DecisionRecord:
    r = DecisionRecord(
        trace_id="trace-demo-001", task="query_product_price", source="user-proxy", started=0.0
    )
    r.candidates = ["price-query-agent"]
    r.selected, r.rule = "price-query-agent", "exact_match"
    r.attempts.append(AttemptRecord("price-query-agent", "SUCCESS", 238.0, "00f067aa0ba902b7", 0.5))
    r.events.append(("forward", "price-query-agent, duration=238ms"))
    r.status, r.http_status, r.handler, r.duration_ms = Status.SUCCESS, 200, "price-query-agent", 240.0
    return r


@pytest.fixture
def configured() -> Iterator[io.StringIO]:
    """configure() writing to a buffer; the global logging state is restored afterwards."""
    buffer = io.StringIO()
    root = logging.getLogger("reachmesh")
    saved = (root.level, root.propagate, list(root.handlers), reach_logging._handler, reach_logging._format)
    reach_logging._handler = None
    try:
        yield buffer
    finally:
        root.setLevel(saved[0])
        root.propagate = saved[1]
        root.handlers[:] = saved[2]
        reach_logging._handler, reach_logging._format = saved[3], saved[4]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_fast_path_matches_the_protocol_lines(configured: io.StringIO, fmt: str) -> None:
    """With the Router's own handler, the trace lines are written directly, in the same shape."""
    reach_logging.configure("INFO", fmt, stream=configured)  # type: ignore[arg-type]
    trace_log = reach_logging.TraceLog()
    assert reach_logging.fast_writer(logging.getLogger(reach_logging.TRACE_LOGGER)) is not None
    trace_log(record())
    lines = configured.getvalue().splitlines()
    if fmt == "text":
        messages = [line.split(" INFO ", 1)[1] for line in lines]
        assert messages[:4] == [
            "[trace-demo-001] route: user-proxy -> query_product_price",
            "[trace-demo-001] candidate agents: price-query-agent",
            "[trace-demo-001] select price-query-agent by exact_match",
            "[trace-demo-001] forward: price-query-agent, duration=238ms",
        ]
        assert all(line[:4].isdigit() and line[23] == "Z" for line in lines)
    else:
        objects = [json.loads(line) for line in lines]
        assert all(o["traceId"] == "trace-demo-001" and o["task"] == "query_product_price" for o in objects)
        assert [o["event"] for o in objects] == ["route", "candidates", "select", "forward", "done"]
        assert objects[3]["durationMs"] == 238.0 and objects[3]["agent"] == "price-query-agent"


def test_an_extra_handler_takes_the_logging_path(configured: io.StringIO) -> None:
    """A handler of the user's own on the trace logger gets the records (no fast path then)."""
    reach_logging.configure("INFO", "text", stream=configured)
    seen: list[logging.LogRecord] = []
    extra = logging.Handler()
    extra.emit = seen.append  # type: ignore[method-assign,assignment]
    trace_logger = logging.getLogger(reach_logging.TRACE_LOGGER)
    trace_logger.addHandler(extra)
    try:
        reach_logging.TraceLog()(record())
    finally:
        trace_logger.removeHandler(extra)
    assert len(seen) == 1 and "route: user-proxy" in seen[0].getMessage()


def test_payloads_are_redacted(configured: io.StringIO) -> None:
    """With log_payloads on, configured fields are masked at any depth."""
    reach_logging.configure("INFO", "text", stream=configured)
    r = record()
    r.payload = {"user": {"password": "hunter2", "name": "x"}, "Token": "abc"}
    reach_logging.TraceLog(redact_fields=["password", "token"])(r)
    text = configured.getvalue()
    assert "hunter2" not in text and "abc" not in text
    assert '"password":"***"' in text and '"name":"x"' in text


@pytest.mark.parametrize(
    ("source", "task"),
    [
        ("user-proxy", "query_product_price"),
        ("evil\nproxy", "query_product_price"),  # a control character in the source alone
        ("user-proxy", "t" * 511 + "\x1b"),  # printable once escaped, and cut: over 512 then
        ("s" * 513, "query_product_price"),  # long, printable
        ("user-proxy", "\u2028" * 300),  # a line separator, escaped to six characters each
    ],
)
def test_the_route_line_shows_source_and_task_as_loggable_does(source: str, task: str) -> None:
    """The route line names the source and the task each as :func:`loggable` writes it (control
    characters escaped, cut to 512 characters), however the line is built."""
    r = record()
    r.source, r.task = source, task
    lines = reach_logging.TraceLog()._lines(r)
    expected = f"[trace-demo-001] route: {loggable(source)} -> {loggable(task)}"
    assert lines[0] == (expected if expected.isprintable() else loggable(expected, 1 << 20))
    assert all(line.isprintable() for line in lines)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_turn_of_records_writes_the_lines_one_call_each_wrote(configured: io.StringIO, fmt: str) -> None:
    """The records of one turn, handed over at once, write each record's lines in order, as one
    call per record does (one timestamp for the turn: its lines go out in one write); a record
    whose lines fail is reported, once, and the others are written."""
    reach_logging.configure("INFO", fmt, stream=configured)  # type: ignore[arg-type]
    trace_log = reach_logging.TraceLog()
    turn = [record(), record(), record()]
    for i, r in enumerate(turn):
        r.trace_id = f"t{i}"
    for r in turn:
        trace_log(r)
    reach_logging._handler.flush()  # type: ignore[union-attr]
    one_by_one = configured.getvalue().splitlines()
    configured.seek(0)
    configured.truncate()
    broken = record()
    broken.events = None  # type: ignore[assignment]
    failed: list[object] = []
    trace_log.observe_all([turn[0], broken, turn[1], turn[2]], failed.append)
    reach_logging._handler.flush()  # type: ignore[union-attr]
    together = configured.getvalue().splitlines()
    assert failed == [trace_log]
    if fmt == "text":
        assert len({line[:24] for line in together}) == 1  # one timestamp for the turn
        assert [line[24:] for line in together] == [line[24:] for line in one_by_one]
    else:
        assert [{**json.loads(line), "ts": "-"} for line in together] == [
            {**json.loads(line), "ts": "-"} for line in one_by_one
        ]


@pytest.mark.parametrize(
    ("trace_id", "kind"),
    [
        ("trace-demo-001", "forward"),
        ("trace\x1b[31m-demo", "forward"),  # an escape in the traceId alone: every line carries it
        ("trace\u2028demo", "forward"),  # a line separator in the traceId
        ("trace-demo-001", "for\nward"),  # a line break in one note's kind alone
    ],
)
@pytest.mark.parametrize("together", [False, True])
def test_each_written_line_is_escaped_whole(
    configured: io.StringIO, trace_id: str, kind: str, together: bool
) -> None:
    """Each text line is the raw line (``[traceId] ...``) as it is, or escaped whole by
    :func:`loggable` when any character of it would not print: the traceId is checked once per
    record, not in each line, and must still escape every line that carries it."""
    reach_logging.configure("INFO", "text", stream=configured)
    trace_log = reach_logging.TraceLog()
    r = record()
    r.trace_id = trace_id
    r.events = [(kind, "price-query-agent, duration=238ms")]
    if together:
        trace_log.observe_all([r, record()], lambda _observer: None)
    else:
        trace_log(r)
    reach_logging._handler.flush()  # type: ignore[union-attr]
    written = [line[24:].removeprefix(" INFO ") for line in configured.getvalue().splitlines()][:5]
    raw = [
        f"[{trace_id}] route: user-proxy -> query_product_price",
        f"[{trace_id}] candidate agents: price-query-agent",
        f"[{trace_id}] select price-query-agent by exact_match",
        f"[{trace_id}] {kind}: price-query-agent, duration=238ms",
        f"[{trace_id}] done: SUCCESS in 240.0ms",
    ]
    assert written == [line if line.isprintable() else loggable(line, 1 << 20) for line in raw]


@pytest.mark.parametrize(
    ("candidates", "line"),
    [
        ([], None),
        (["a1"], "[trace-demo-001] candidate agents: a1"),
        (["a1", "a2"], "[trace-demo-001] candidate agents: a1, a2"),
        (
            [f"a{i}" for i in range(MAX_CANDIDATES_SHOWN + 2)],
            "[trace-demo-001] candidate agents: "
            + ", ".join(f"a{i}" for i in range(MAX_CANDIDATES_SHOWN))
            + " (+2 more)",
        ),
    ],
)
def test_the_candidates_line_lists_the_first_few(candidates: list[str], line: str | None) -> None:
    """One candidate, several, more than are shown, or none (no line): one line's shape each."""
    r = record()
    r.candidates = candidates
    found = [text for text in reach_logging.TraceLog()._lines(r) if "candidate agents:" in text]
    assert found == ([] if line is None else [line])
