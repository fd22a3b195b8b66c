"""Log set-up and the trace log lines of PROTOCOL.md §7.

The text form keeps the protocol's lines exactly; ``[traceId] route: ...`` and friends are the
message, after a timestamp and level.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Literal

from agent_reach.observability.record import DecisionRecord

TRACE_LOGGER = "agent_reach.trace"

_configured = False


class _UTCFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        ct = time.gmtime(record.created)
        return time.strftime("%Y-%m-%dT%H:%M:%S", ct) + f".{int(record.msecs):03d}Z"


def configure(level: str = "INFO", fmt: Literal["text", "json"] = "text") -> None:
    """Send Agent-Reach's logs to stderr, one line per record. Safe to call more than once."""
    global _configured
    root = logging.getLogger("agent_reach")
    root.setLevel(level)
    if _configured:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_UTCFormatter("%(asctime)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.propagate = False
    _configured = True


class TraceLog:
    """The observer that writes a request's trace lines from its finished record."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger(TRACE_LOGGER)

    def __call__(self, record: DecisionRecord) -> None:
        log = self._log
        if not log.isEnabledFor(logging.INFO):
            return
        tid = record.trace_id
        log.info("[%s] route: %s -> %s", tid, record.source, record.task)
        if record.candidates:
            log.info("[%s] candidate agents: %s", tid, ", ".join(record.candidates))
        if record.selected is not None:
            if record.score is not None:
                log.info("[%s] select %s by %s (score=%.2f)", tid, record.selected, record.rule, record.score)
            else:
                log.info("[%s] select %s by %s", tid, record.selected, record.rule)
        for kind, text in record.events:
            log.info("[%s] %s: %s", tid, kind, text)
