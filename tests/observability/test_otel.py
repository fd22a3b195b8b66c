"""OpenTelemetry export, with the SDK's in-memory exporter."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reachmesh.decision import AttemptRecord, DecisionRecord
from reachmesh.observability.otel import OtelExporter
from reachmesh.protocol import Status
from reachmesh.tracecontext import w3c_trace_id


def test_hop_and_attempt_spans() -> None:
    """A record becomes a hop span (child of the caller's span) with one child span per attempt."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    record = DecisionRecord(
        trace_id="otel-1",
        task="echo",
        source="caller",
        started=0.0,
        started_wall=1_767_225_600.0,
        parent_span_id="00f067aa0ba902b7",
    )
    record.attempts = [
        AttemptRecord("a", "connect_error", 1.0, "aaaaaaaaaaaaaaaa", 0.1),
        AttemptRecord("b", "SUCCESS", 2.0, "bbbbbbbbbbbbbbbb", 1.5),
    ]
    record.status, record.handler, record.duration_ms = Status.SUCCESS, "b", 4.0
    OtelExporter(provider)(record)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"reach echo", "attempt a", "attempt b"}
    hop = spans["reach echo"]
    attempt = spans["attempt a"]
    assert hop.context is not None and hop.parent is not None and attempt.parent is not None
    assert hop.attributes is not None and hop.end_time is not None and hop.start_time is not None
    assert format(hop.context.trace_id, "032x") == w3c_trace_id("otel-1")
    assert format(hop.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert attempt.parent.span_id == hop.context.span_id
    assert attempt.status.status_code.name == "ERROR"
    assert hop.attributes["reach.handler"] == "b"
    assert (hop.end_time - hop.start_time) == 4_000_000


async def test_sdk_emits_a_span_per_handled_request() -> None:
    """With otel on, the SDK emits one span per handled request, child of the Router's attempt span."""
    import httpx
    from opentelemetry import trace

    from reachmesh.sdk import AgentConfig, ReachAgent
    from reachmesh.testing import RouterServer, free_port

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    async with RouterServer() as server:
        agent = ReachAgent(
            AgentConfig.from_mapping(
                {
                    "agent": {
                        "id": "otel-agent",
                        "network": {"endpoint": f"http://127.0.0.1:{free_port()}/reach"},
                        "capabilities": [{"task": "echo"}],
                    },
                    "router": {"url": server.url},
                },
                env={},
            ),
            otel=True,
        )
        agent.capability("echo")(lambda payload: payload)
        await agent.start()
        try:
            async with httpx.AsyncClient() as http:
                body = (await http.post(f"{server.url}/reach", json={"targetTask": "echo"})).json()
            hop = server.app.parts.traces.hops(body["traceId"])[0]
            spans = [s for s in exporter.get_finished_spans() if s.name == "handle echo"]
            assert len(spans) == 1 and spans[0].parent is not None
            assert format(spans[0].parent.span_id, "016x") == hop["attempts"][0]["spanId"]
            assert format(spans[0].context.trace_id, "032x") == w3c_trace_id(body["traceId"])
        finally:
            await agent.stop()
