"""Log set-up and the trace log lines of PROTOCOL.md §7.

Two formats: ``text`` keeps the protocol's lines exactly (``[traceId] route: ...`` after a
timestamp and level); ``json`` writes one object per line, and trace lines carry ``traceId``,
``task``, ``agent``, ``event`` and the durations as fields. Payloads are never logged unless
``log_payloads`` is on, and then with the configured fields redacted.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import orjson

from agent_reach.observability.record import DecisionRecord

TRACE_LOGGER = "agent_reach.trace"
REDACTED = "***"

_handler: logging.Handler | None = None


def _stamp(created: float, msecs: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """``2026-01-15T10:24:18.302Z INFO <message>``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_stamp(record.created, record.msecs)} {record.levelname} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; the ``reach`` extra of a record becomes top-level fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _stamp(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "reach", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure(
    level: str = "INFO", fmt: Literal["text", "json"] = "text", levels: Mapping[str, str] | None = None
) -> None:
    """Send Agent-Reach's logs to stderr, one line per record. Calling again changes the format."""
    global _handler
    root = logging.getLogger("agent_reach")
    root.setLevel(level)
    for name, name_level in (levels or {}).items():
        logging.getLogger(name).setLevel(name_level)
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        root.addHandler(_handler)
        root.propagate = False
    _handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())


def redact(value: Any, fields: Iterable[str]) -> Any:
    """A copy of ``value`` with every key named in ``fields`` (any depth, any case) masked."""
    names = {f.lower() for f in fields}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (REDACTED if str(k).lower() in names else walk(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(value)


class TraceLog:
    """The observer that writes a request's trace lines from its finished record."""

    def __init__(self, logger: logging.Logger | None = None, *, redact_fields: Iterable[str] = ()) -> None:
        self._log = logger or logging.getLogger(TRACE_LOGGER)
        self.redact_fields = list(redact_fields)

    def __call__(self, record: DecisionRecord) -> None:
        log = self._log
        if not log.isEnabledFor(logging.INFO):
            return
        tid = record.trace_id
        base = {"traceId": tid, "task": record.task, "agent": record.selected}

        def line(event: str, message: str, *args: Any, **fields: Any) -> None:
            log.info(message, *args, extra={"reach": {**base, "event": event, **fields}})

        line("route", "[%s] route: %s -> %s", tid, record.source, record.task, source=record.source)
        if record.payload is not None:
            shown = orjson.dumps(redact(record.payload, self.redact_fields)).decode()
            line("payload", "[%s] payload: %s", tid, shown)
        if record.candidates:
            line(
                "candidates",
                "[%s] candidate agents: %s",
                tid,
                ", ".join(record.candidates),
                candidates=record.candidates,
            )
        if record.selected is not None:
            if record.score is not None:
                line(
                    "select",
                    "[%s] select %s by %s (score=%.2f)",
                    tid,
                    record.selected,
                    record.rule,
                    record.score,
                    rule=record.rule,
                    score=record.score,
                )
            else:
                line("select", "[%s] select %s by %s", tid, record.selected, record.rule, rule=record.rule)
        attempts = iter(record.attempts)
        for kind, text in record.events:
            fields: dict[str, Any] = {}
            if kind == "forward":
                attempt = next(attempts, None)
                if attempt is not None:
                    fields = {
                        "agent": attempt.agent_id,
                        "durationMs": attempt.duration_ms,
                        "outcome": attempt.outcome,
                    }
            line(kind, "[%s] %s: %s", tid, kind, text, **fields)
        line(
            "done",
            "[%s] done: %s in %.1fms",
            tid,
            record.status.value if record.status else "-",
            record.duration_ms,
            agent=record.handler,
            status=record.status.value if record.status else None,
            durationMs=record.duration_ms,
            httpStatus=record.http_status,
        )
