"""Trace ids and W3C ``traceparent``.

A Router-made ``traceId`` is 32 lowercase hex digits, so it *is* the W3C trace id and one id
names the request in logs, traces and spans. A caller's own ``traceId`` may be any safe string;
its W3C trace id is then derived from it deterministically, so every hop derives the same one.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from typing import Any

_random = random.Random()

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


# Trace ids name async results, so they stay unguessable: bytes from the operating system's
# generator, as secrets.token_hex would take, but read 4 KiB at a time (256 ids): one getrandom()
# system call per request was measurable. The batch is cut into its ids at once, in C, and each
# call pops one: a list's pop is atomic, so threads (an SDK's, a test's) asking at once are never
# handed the same id, with no lock taken per id. A forked child starts with an empty list of its
# own, or parent and child would hand out the same ids.
_ID_HEX = 32
_BATCH = 256 * _ID_HEX // 2
_ID = re.compile(f".{{{_ID_HEX}}}", re.DOTALL)
_ids: list[str] = []
# Span ids likewise, 256 at a time from the fast generator (see new_span_id).
_SPAN_HEX = 16
_SPAN_BATCH = 256
_SPAN = re.compile(f".{{{_SPAN_HEX}}}", re.DOTALL)
_NO_SPAN = "0" * _SPAN_HEX  # not a valid span id (W3C): never handed out
_span_ids: list[str] = []


def _forget_entropy() -> None:
    _ids.clear()
    _span_ids.clear()
    _random.seed()  # the child's own sequence, not the parent's next span ids


os.register_at_fork(after_in_child=_forget_entropy)


def new_trace_id() -> str:
    """A fresh trace id: 128 random bits (from the OS generator) as 32 hex digits."""
    while True:
        try:
            return _ids.pop()
        except IndexError:
            # Refilled by whichever thread finds it empty; two at once each add fresh bytes.
            _ids.extend(_ID.findall(os.urandom(_BATCH).hex()))


def w3c_trace_id(trace_id: str) -> str:
    """The W3C trace id for ``trace_id``: itself when it already is one, else a stable hash."""
    if _HEX32.match(trace_id) and trace_id != "0" * 32:
        return trace_id
    return hashlib.blake2b(trace_id.encode(), digest_size=16).hexdigest()


def new_span_id() -> str:
    """A fresh W3C span id: 64 random bits as 16 hex digits.

    Span ids only need to be unique, not unguessable (trace ids, which name async results,
    stay cryptographic), so they come from the fast generator: one per attempt adds up.
    """
    while True:
        try:
            return _span_ids.pop()  # atomic: two threads are never handed the same one
        except IndexError:
            digits = f"{_random.getrandbits(_SPAN_HEX * 4 * _SPAN_BATCH):0{_SPAN_HEX * _SPAN_BATCH}x}"
            batch = _SPAN.findall(digits)
            while _NO_SPAN in batch:  # one in 2**64: looked for in C, not per id in Python
                batch.remove(_NO_SPAN)
            _span_ids.extend(batch)


def parse_traceparent(header: str | None) -> tuple[str, str] | None:
    """``(trace id, parent span id)`` of a valid version-00 ``traceparent``, else ``None``."""
    if not header:
        return None
    match = _TRACEPARENT.match(header.strip().lower())
    if match is None or match.group(1) == "0" * 32 or match.group(2) == "0" * 16:
        return None
    return match.group(1), match.group(2)


def make_traceparent(trace_id: str, span_id: str | None = None) -> str:
    """A ``traceparent`` in ``trace_id`` whose parent is ``span_id`` (default: a new span)."""
    return f"00-{w3c_trace_id(trace_id)}-{span_id or new_span_id()}-01"


def otel_remote_parent(trace_id: str, span_id: str | None) -> Any:
    """An OpenTelemetry context whose parent is the W3C (trace id, span id) a caller sent.

    Only called where the optional ``otel`` extra is known to be installed (the Router's
    exporter, the SDK's agent spans), so OpenTelemetry is imported here and not at module load.
    """
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import SpanContext, TraceFlags

    parent = SpanContext(
        int(w3c_trace_id(trace_id), 16),
        int(span_id or "1", 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(parent))
