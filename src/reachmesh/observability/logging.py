"""Log set-up and the trace log lines of PROTOCOL.md §7.

Two formats: ``text`` keeps the protocol's lines exactly (``[traceId] route: ...`` after a
timestamp and level); ``json`` writes one object per line, and trace lines carry ``traceId``,
``task``, ``agent``, ``event`` and the durations as fields. Payloads are never logged unless
``log_payloads`` is on, and then with the configured fields redacted.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, Literal

import orjson

from reachmesh.decision import DecisionRecord
from reachmesh.exceptions import MAX_CANDIDATES_SHOWN
from reachmesh.redaction import loggable

TRACE_LOGGER = "reachmesh.trace"
REDACTED = "***"


class TraceHandler(logging.StreamHandler[Any]):
    """The stderr handler, which also writes the trace lines in batches.

    The trace lines of every request finished in one turn of the event loop go out in one write
    at the end of that turn, instead of one write (and one system call) per request. Nothing is
    held longer than that turn, and nothing is reordered: any other log record, a ``flush()``
    and the interpreter's exit (``logging.shutdown`` flushes every handler) write the pending
    lines first. (A loop stopped, not closed, with a write due writes it when it runs again, or
    at the next record, flush or exit, whichever comes first.) A background thread was not
    used: the Router runs on one core, where handing lines to a thread costs a wake-up and a
    context switch each time, and saves no CPU.
    """

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        # The loop a flush is scheduled on; a test may close one loop and start another.
        self._scheduled_on: asyncio.AbstractEventLoop | None = None

    def defer(self, text: str) -> None:
        """Write ``text`` (whole lines) at the end of this turn of the running loop, or now."""
        scheduled = self._scheduled_on
        if scheduled is not None and not scheduled.is_closed():
            # A write is already due at the end of this turn: asking for the running loop
            # again costs a getpid() system call (asyncio checks for a fork) on every request.
            self._pending.append(text)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._pending.append(text)
            self.write_pending()
            return
        self._pending.append(text)
        if self._scheduled_on is not loop:
            self._scheduled_on = loop
            loop.call_soon(self.write_pending)

    def write_pending(self) -> None:
        self._scheduled_on = None
        if not self._pending:
            return
        # The handler's lock (Handler.acquire and release, without their two Python calls).
        with self.lock:  # type: ignore[union-attr]
            pending, self._pending = self._pending, []
            stream = self.stream
            stream.write("".join(pending))
            stream.flush()

    def emit(self, record: logging.LogRecord) -> None:
        if self._pending:
            self.write_pending()
        super().emit(record)

    def flush(self) -> None:
        if self._pending:
            self.write_pending()
        super().flush()


_handler: TraceHandler | None = None


def _stamp(created: float, msecs: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


# How much of one argument a log line shows.
_ARG_LIMIT = 4096


class _Clean(str):
    """A log argument with its control characters escaped; ``%r`` shows the original's repr,
    which Python already writes without raw control characters."""

    __slots__ = ("_repr",)
    _repr: str

    def __new__(cls, original: object) -> _Clean:
        clean = super().__new__(cls, loggable(original, _ARG_LIMIT))
        clean._repr = loggable(repr(original), _ARG_LIMIT)
        return clean

    def __repr__(self) -> str:
        return self._repr


def _clean_arg(arg: object) -> object:
    if arg is None or isinstance(arg, int | float):
        return arg
    return _Clean(arg)


def message_of(record: logging.LogRecord) -> str:
    """``record.getMessage()`` with every argument escaped: the arguments are where callers' and
    agents' text (a payload key, an agent's error message) enters a log line, so none of it can
    start a line of its own or carry a terminal escape. The template is the code's own."""
    args = record.args
    if not args:
        text = str(record.msg)
        return text if text.isprintable() else _escaped_lines(text)
    if isinstance(args, Mapping):
        return str(record.msg) % {key: _clean_arg(value) for key, value in args.items()}
    return str(record.msg) % tuple(_clean_arg(arg) for arg in args)


def _escaped_lines(text: str) -> str:
    """``text`` with each of its lines escaped: a traceback keeps its shape, not its escapes."""
    return "\n".join(loggable(line, 1 << 20) for line in text.split("\n"))


def _ours(record: logging.LogRecord) -> bool:
    return record.name == "reachmesh" or record.name.startswith("reachmesh.")


def foreign_message(record: logging.LogRecord) -> str:
    """Another library's message (a2a-sdk's, uvicorn's), on one line, its logger named: such a
    library writes what it was sent into the text (``f"Task {task_id} not found"``), so a line
    break or a terminal escape in it is caller text, never the library's own layout."""
    try:
        text = record.getMessage()
    except (TypeError, ValueError, KeyError):  # a bad format string must not lose the line
        text = f"{record.msg!r} % {record.args!r}"
    return f"[{loggable(record.name, 128)}] {loggable(text, _ARG_LIMIT * 4)}"


class TextFormatter(logging.Formatter):
    """``2026-01-15T10:24:18.302Z INFO <message>``, the prefix repeated on each line of a message
    and of a traceback, so no text inside either can stand as a line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"{_stamp(record.created, record.msecs)} {record.levelname} "
        message = message_of(record) if _ours(record) else foreign_message(record)
        if record.exc_info:
            # An exception's message is often a caller's text ("Task <id> not found").
            message += "\n" + _escaped_lines(self.formatException(record.exc_info))
        return prefix + message.replace("\n", "\n" + prefix) if "\n" in message else prefix + message


class JsonFormatter(logging.Formatter):
    """One JSON object per line; the ``reach`` extra of a record becomes top-level fields."""

    def format(self, record: logging.LogRecord) -> str:
        head = {"ts": _stamp(record.created, record.msecs), "level": record.levelname, "logger": record.name}
        out = []
        lines = split_lines(record) if _ours(record) else [(foreign_message(record), {})]
        for message, fields in lines:
            line = {**head, "message": message, **fields}
            if record.exc_info:
                line["exception"] = _escaped_lines(self.formatException(record.exc_info))
            out.append(orjson.dumps(line, default=str).decode())
        return "\n".join(out)


def configure(
    level: str = "INFO",
    fmt: Literal["text", "json"] = "text",
    levels: Mapping[str, str] | None = None,
    stream: Any = None,
    *,
    take_root: bool = False,
) -> None:
    """Send Agent-Reach's logs to stderr, one line per record. Calling again changes the format.

    ``take_root``: the same handler and formatter become the root logger's only handler, so
    every other library's records (a2a-sdk's, uvicorn's) are escaped too; without it they went
    to Python's last-resort handler raw, a forged line and an ESC with them. The process's
    entry point (``reach router``) takes the root; a library embedding the Router does not.
    """
    global _handler
    # The Router logs on every request: skip the caller lookup and the thread/process fields
    # no formatter here prints.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger("reachmesh")
    root.setLevel(level)
    for name, name_level in (levels or {}).items():
        logging.getLogger(name).setLevel(name_level)
    if _handler is None:
        _handler = TraceHandler(stream if stream is not None else sys.stderr)
        root.addHandler(_handler)
        root.propagate = False
    _handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if take_root:
        logging.getLogger().handlers[:] = [_handler]
    global _format
    _format = fmt


_format: str = "text"
_stamp_second = -1
_stamp_prefix = ""


def _fast_stamp(now: float) -> str:
    """``_stamp`` with the seconds part cached: it changes once a second, requests come faster."""
    global _stamp_second, _stamp_prefix
    second = int(now)
    if second != _stamp_second:
        _stamp_second = second
        _stamp_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_stamp_prefix}.{int((now - second) * 1000):03d}Z"


def fast_writer(logger: logging.Logger) -> TraceHandler | None:
    """The stream to write ``logger``'s lines to directly, or None when logging must decide.

    Only when the lines would end up in exactly the handler :func:`configure` installed (no
    other handler on the way, as in tests with ``caplog``): then a request's lines are formatted
    here and handed to the handler's batch, skipping LogRecord creation and handler dispatch.
    """
    node: logging.Logger | None = logger
    while node is not None:
        if node.handlers and node.handlers != [_handler]:
            return None
        if node.handlers or not node.propagate:
            break
        node = node.parent
    if node is None or _handler is None or not node.handlers:
        return None
    return _handler


def redact(value: Any, fields: Iterable[str]) -> Any:
    """A copy of ``value`` with every key matching ``fields`` masked: any depth, any case, and
    glob patterns (``*token*`` catches ``accessToken`` and ``x_token_id``)."""
    names = {f.lower() for f in fields if not any(c in f for c in "*?[")}
    patterns = [f.lower() for f in fields if any(c in f for c in "*?[")]

    def secret(key: object) -> bool:
        name = str(key).lower()
        return name in names or any(fnmatchcase(name, p) for p in patterns)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (REDACTED if secret(k) else walk(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(value)


class TraceLog:
    """The observer that writes a request's trace lines from its finished record.

    All of a request's lines go out as one log record (one formatting pass, one write): the
    text formatter puts the timestamp on each line, the JSON formatter writes one object per
    line with the fields in ``reach_lines``. Per-line records cost about four times as much CPU,
    and the Router writes these for every request.
    """

    def __init__(self, logger: logging.Logger | None = None, *, redact_fields: Iterable[str] = ()) -> None:
        self._log = logger or logging.getLogger(TRACE_LOGGER)
        self.redact_fields = list(redact_fields)

    def apply(self, redact_fields: Iterable[str]) -> None:
        """Redact a reloaded list of fields from the next line on."""
        self.redact_fields = list(redact_fields)

    def __call__(self, record: DecisionRecord) -> None:
        log = self._log
        if not log.isEnabledFor(logging.INFO):
            return
        handler = fast_writer(log)
        if handler is not None and _format != "json":  # the Router's own handler, in text
            head, bodies = self._bodies(record)
            prefix = f"{_fast_stamp(time.time())} INFO {head}"
            handler.defer(prefix + ("\n" + prefix).join(bodies) + "\n")
            return
        self._write(record, self._lines(record), handler)

    def observe_all(self, records: Sequence[DecisionRecord], failed: Callable[[Any], None]) -> None:
        """The lines of each record, in order, as one call per record writes them; a record whose
        lines fail is reported to ``failed`` (inside its ``except`` block), the others written.

        The end of the loop's turn hands over every record of the turn at once (about 16 under
        load at c32): the level, the handler and the timestamp are looked up once for the turn,
        whose lines go out in one write at its end in any case."""
        if len(records) == 1:  # the turn's only record
            try:
                self(records[0])
            except Exception:  # noqa: BLE001 - reported as for a record of a longer turn
                failed(self)
            return
        log = self._log
        if not log.isEnabledFor(logging.INFO):
            return
        handler = fast_writer(log)
        if handler is None or _format == "json":
            for record in records:
                try:
                    self(record)
                except Exception:  # noqa: BLE001 - one record's bug must not cost the others their lines
                    failed(self)
            return
        stamp = f"{_fast_stamp(time.time())} INFO "
        texts = []
        for record in records:
            try:
                head, bodies = self._bodies(record)
                prefix = stamp + head
                texts.append(prefix + ("\n" + prefix).join(bodies) + "\n")
            except Exception:  # noqa: BLE001 - one record's bug must not cost the others their lines
                failed(self)
        if texts:
            handler.defer("".join(texts))

    def _lines(self, record: DecisionRecord) -> list[str]:
        """The request's trace lines (text); :meth:`_fields` gives each one's structured fields."""
        head, bodies = self._bodies(record)
        return [head + body for body in bodies]

    def _bodies(self, record: DecisionRecord) -> tuple[str, list[str]]:
        """``("[traceId] ", the lines after it)``: the writers put the head before each line.

        The head is checked once, not once in each line: ``str.isprintable`` reads every
        character (about 1.6 ns each), and five copies of the traceId were most of a request's
        text (about 250 ns a request)."""
        tid = record.trace_id
        # Caller text: a line separator, NEL or bidi control must not start or fake a line.
        # loggable(source) and loggable(task) are themselves when short and printable: the length
        # is tested here, and whether they print with every other line's (below).
        source, task = record.source, record.task
        if len(source) > 512 or len(task) > 512:
            source, task = loggable(source), loggable(task)
        lines = [f"route: {source} -> {task}"]
        if record.payload is not None:
            lines.append(f"payload: {orjson.dumps(redact(record.payload, self.redact_fields)).decode()}")
        candidates = record.candidates
        if len(candidates) == 1:  # most requests: without the slice, the join and the count
            lines.append(f"candidate agents: {candidates[0]}")
        elif candidates:
            shown = candidates[:MAX_CANDIDATES_SHOWN]
            more = len(candidates) - len(shown)
            lines.append(f"candidate agents: {', '.join(shown)}" + (f" (+{more} more)" if more else ""))
        if record.selected is not None:
            if record.score is not None:
                lines.append(f"select {record.selected} by {record.rule} (score={record.score:.2f})")
            else:
                lines.append(f"select {record.selected} by {record.rule}")
        for kind, text in record.events:
            lines.append(f"{kind}: {text}")
        status = record.status
        # The member's value: formatting the enum itself goes through Enum.__format__ (about 60 ns).
        lines.append(f"done: {'-' if status is None else status._value_} in {record.duration_ms:.1f}ms")
        # Every line is checked whole (one C pass over all of them when clean): the notes, the
        # payload's keys and values and the rule names all come from outside, and none may
        # carry a line break or a terminal escape.
        head = f"[{tid}] "
        if "".join(lines).isprintable() and tid.isprintable():
            return head, lines
        lines = [head + line for line in lines]
        lines[0] = f"[{tid}] route: {loggable(record.source)} -> {loggable(record.task)}"
        return "", [line if line.isprintable() else loggable(line, 1 << 20) for line in lines]

    @staticmethod
    def _fields(record: DecisionRecord) -> list[dict[str, Any]]:
        """The structured fields of each of :meth:`_lines`, in order: only the JSON format and
        other handlers than the Router's own read them, so the text format never builds them."""
        fields: list[dict[str, Any]] = [{"event": "route", "source": loggable(record.source)}]
        if record.payload is not None:
            fields.append({"event": "payload"})
        if record.candidates:
            shown = record.candidates[:MAX_CANDIDATES_SHOWN]
            more = len(record.candidates) - len(shown)
            fields.append({"event": "candidates", "candidates": shown, "candidatesOmitted": more})
        if record.selected is not None:
            fields.append({"event": "select", "rule": record.rule, "score": record.score})
        attempts = iter(record.attempts)
        for kind, _ in record.events:
            attempt = next(attempts, None) if kind == "forward" else None
            if attempt is not None:
                fields.append(
                    {
                        "event": kind,
                        "agent": attempt.agent_id,
                        "durationMs": attempt.duration_ms,
                        "outcome": attempt.outcome,
                    }
                )
            else:
                fields.append({"event": kind})
        fields.append(
            {
                "event": "done",
                "agent": record.handler,
                "status": record.status.value if record.status else "-",
                "durationMs": record.duration_ms,
                "httpStatus": record.http_status,
            }
        )
        return fields

    def _write(self, record: DecisionRecord, lines: list[str], handler: TraceHandler | None) -> None:
        """The lines as JSON to the Router's handler, or as a log record to whatever handles it."""
        log = self._log
        fields = self._fields(record)
        base = {"traceId": record.trace_id, "task": loggable(record.task), "agent": record.selected}
        if handler is None:
            log.info("\n".join(lines), extra={"reach_lines": fields, "reach": base})
            return
        head = {"ts": _fast_stamp(time.time()), "level": "INFO", "logger": log.name}
        text = "\n".join(
            orjson.dumps({**head, "message": line, **base, **extra}, default=str).decode()
            for line, extra in zip(lines, fields, strict=True)
        )
        handler.defer(text + "\n")


def split_lines(record: logging.LogRecord) -> list[tuple[str, dict[str, Any]]]:
    """The (message, fields) pairs of a log record: one per line of a trace record, else one."""
    message = message_of(record)
    base = getattr(record, "reach", None) or {}
    per_line = getattr(record, "reach_lines", None)
    if not per_line:
        return [(message, dict(base))]
    return [(text, {**base, **extra}) for text, extra in zip(message.split("\n"), per_line, strict=False)]
