"""OpenTelemetry export (the ``otel`` extra): one span per hop, one child span per attempt.

Imported lazily and only when ``tracing.otel`` is on, so the Router has no OpenTelemetry
dependency otherwise. It uses the OpenTelemetry API only: where spans go (OTLP, console, ...) is
set up the usual OpenTelemetry way, by the SDK and its ``OTEL_*`` environment.

Span ids are the Router's own W3C ids, so the spans line up with ``traceparent`` as agents see
it: a hop's parent is the caller's span, and each attempt span is the ``traceparent`` the agent
received.
"""

from __future__ import annotations

from typing import Any

from reachmesh.decision import DecisionRecord
from reachmesh.exceptions import MAX_CANDIDATES_SHOWN, ConfigError
from reachmesh.tracecontext import otel_remote_parent

try:  # pragma: no cover - exercised when the extra is installed
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover
    otel_trace = None  # type: ignore[assignment]


class OtelExporter:
    """The observer that turns finished decision records into OpenTelemetry spans."""

    def __init__(self, tracer_provider: Any = None) -> None:
        if otel_trace is None:
            raise ConfigError(
                "tracing.otel is on, but OpenTelemetry is not installed: pip install 'reachmesh[otel]'"
            )
        self._tracer = otel_trace.get_tracer("reachmesh.router", tracer_provider=tracer_provider)

    def __call__(self, record: DecisionRecord) -> None:
        start_ns = int(record.started_wall * 1e9)
        end_ns = start_ns + int(record.duration_ms * 1e6)
        # No caller span: a placeholder parent still pins the trace id, so every hop shares it.
        context = otel_remote_parent(record.trace_id, record.parent_span_id)
        status = record.status.value if record.status else "UNKNOWN"
        span = self._tracer.start_span(
            f"reach {record.task}",
            context=context,
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes={
                "reach.trace_id": record.trace_id,
                "reach.task": record.task,
                "reach.source": record.source,
                "reach.status": status,
                "reach.handler": record.handler or "",
                "reach.rule": record.rule or "",
                "reach.candidates": ",".join(record.candidates[:MAX_CANDIDATES_SHOWN]),
                "reach.attempts": len(record.attempts),
            },
        )
        hop_context = otel_trace.set_span_in_context(span)
        for attempt in record.attempts:
            attempt_start = start_ns + int(attempt.offset_ms * 1e6)
            child = self._tracer.start_span(
                f"attempt {attempt.agent_id}",
                context=hop_context,
                kind=SpanKind.CLIENT,
                start_time=attempt_start,
                attributes={
                    "reach.agent": attempt.agent_id,
                    "reach.outcome": attempt.outcome,
                    "reach.span_id": attempt.span_id,
                },
            )
            if attempt.outcome != "SUCCESS":
                child.set_status(Status(StatusCode.ERROR, attempt.outcome))
            child.end(end_time=attempt_start + int(attempt.duration_ms * 1e6))
        if status != "SUCCESS":
            span.set_status(Status(StatusCode.ERROR, record.error_code or status))
        span.end(end_time=end_ns)
