"""OpenTelemetry spans on the agent's side (the ``otel`` extra, on with ``REACH_OTEL``).

One SERVER span per handled request, child of the Router's attempt span as the agent received
it in ``traceparent``, so the agent's work lines up under the Router's trace. Imported lazily,
only when tracing is on, so the SDK has no OpenTelemetry dependency otherwise.
"""

from __future__ import annotations

from typing import Any

from reachmesh.exceptions import ConfigError
from reachmesh.tracecontext import otel_remote_parent

try:  # pragma: no cover - exercised when the extra is installed
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover
    otel_trace = None  # type: ignore[assignment]


class AgentSpans:
    """The SDK side: one SERVER span per handled request, child of the Router's attempt span."""

    def __init__(self, agent_id: str, tracer_provider: Any = None) -> None:
        if otel_trace is None:
            raise ConfigError(
                "REACH_OTEL is on, but OpenTelemetry is not installed: pip install 'reachmesh[otel]'"
            )
        self._agent_id = agent_id
        self._tracer = otel_trace.get_tracer("reachmesh.sdk", tracer_provider=tracer_provider)

    def start(self, task: str, trace_id: str, parent_span_id: str | None) -> Any:
        """Start the span of one handled request; the caller ends it with ``end(span, outcome)``."""
        context = otel_remote_parent(trace_id, parent_span_id)
        return self._tracer.start_span(
            f"handle {task}",
            context=context,
            kind=SpanKind.SERVER,
            attributes={"reach.agent": self._agent_id, "reach.task": task, "reach.trace_id": trace_id},
        )

    @staticmethod
    def end(span: Any, outcome: str) -> None:
        span.set_attribute("reach.outcome", outcome)
        if outcome != "success":
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()
