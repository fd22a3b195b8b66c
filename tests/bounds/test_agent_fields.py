"""What an agent sends that the Router keeps is bounded in type and size, and the trace store is
bounded in bytes: an agent answering an 8 MB error ``code`` once grew the Router by 10 MiB a call."""

from __future__ import annotations

import httpx
import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord
from reachmesh.observability.traces import TraceStore
from reachmesh.testing import FakeAgent, RouterServer
from reachmesh.transport.base import MAX_ERROR_MESSAGE_CHARS, normalise_error

MIB = 1024 * 1024


def config() -> RouterConfig:
    return RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}
    )


@pytest.mark.parametrize(
    ("code", "kept"),
    [
        ("ORDER_NOT_FOUND", "ORDER_NOT_FOUND"),
        ("billing.quota:exceeded-2", "billing.quota:exceeded-2"),
        ("C" * 65, "AGENT_ERROR"),
        ("C" * 8 * MIB, "AGENT_ERROR"),
        ("two words", "AGENT_ERROR"),
        ("line\nbreak", "AGENT_ERROR"),
        (12345, "AGENT_ERROR"),
        ({"nested": ["x"] * 1000}, "AGENT_ERROR"),
        (None, "AGENT_ERROR"),
    ],
)
def test_only_a_short_identifier_is_kept_as_an_agents_error_code(code: object, kept: str) -> None:
    assert normalise_error({"code": code, "message": "m"}, "fallback")["code"] == kept


def test_an_agents_error_message_is_a_string_cut_to_a_paragraph() -> None:
    long = normalise_error({"code": "X", "message": "m" * MIB}, "fallback")["message"]
    assert long.startswith("m" * MAX_ERROR_MESSAGE_CHARS) and len(long) < MAX_ERROR_MESSAGE_CHARS + 80
    assert "cut by the Router" in long
    assert normalise_error({"code": "X", "message": ["not", "text"]}, "fallback")["message"] == "fallback"


async def test_an_agent_answering_a_huge_error_code_leaves_the_trace_store_small() -> None:
    """The agent's own token may call it, and each call used to keep its 1 MiB code in a hop."""
    huge = {"status": "AGENT_ERROR", "error": {"code": "C" * MIB, "message": "M" * MIB, "retryable": False}}
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        agent = FakeAgent("loud-agent", tasks=("loud",), raw_answer=orjson.dumps(huge))
        await agent.start()
        try:
            await agent.register(router.url, vectors=False)
            store = router.app.parts.traces
            before = store.bytes_held
            for i in range(5):
                call = {"traceId": f"loud-{i}", "targetTask": "loud", "payload": {}}
                answer = (await http.post("/reach", json=call)).json()
                assert answer["status"] == "AGENT_ERROR"
                assert answer["error"]["code"] == "AGENT_ERROR"
                assert len(answer["error"]["message"]) < MAX_ERROR_MESSAGE_CHARS + 80
            assert store.bytes_held - before < 5 * 8 * 1024  # five hops of a few KiB, not 5 MiB
            hop = (await http.get("/admin/traces/loud-4")).json()["hops"][0]
            assert hop["errorCode"] == "AGENT_ERROR"
            metrics = (await http.get("/metrics")).text
            assert f"reach_trace_store_bytes {float(store.bytes_held)}" in metrics
        finally:
            await agent.stop()


def record(trace_id: str, notes: int = 0) -> DecisionRecord:
    r = DecisionRecord(trace_id=trace_id, task="t" * 1000, source="caller", started=0.0)
    for i in range(notes):
        r.note("retry", f"{i}:" + "n" * 2000)
    return r


def test_a_hop_over_its_bound_is_kept_without_its_notes() -> None:
    store = TraceStore(100, max_bytes=1 << 30, max_hop_bytes=8192)
    store(record("big", notes=50))  # about 100 KB of notes
    assert store.bytes_held <= 8192 and store.slimmed == 1
    (hop,) = store.hops("big")
    assert hop["traceId"] == "big" and len(hop["task"]) <= 257
    assert [e["kind"] for e in hop["events"]] == ["trace"] and "left out" in hop["events"][0]["text"]
    store(record("small"))
    assert store.slimmed == 1 and store.hops("small")[0]["task"] == "t" * 1000


def test_the_store_keeps_within_its_byte_budget_dropping_the_oldest() -> None:
    store = TraceStore(10_000, max_bytes=200_000, max_hop_bytes=64 * 1024)
    for i in range(500):
        store(record(f"r{i}", notes=10))
        assert store.bytes_held <= 200_000
    assert store.evicted_for_bytes > 0 and len(store) < 500
    assert store.hops("r499") and not store.hops("r0")
    assert store.bytes_held == sum(len(h) for h in store._hops)
    store.resize(10_000, 50_000, 64 * 1024)
    store(record("after"))
    assert store.bytes_held <= 50_000 and store.hops("after")
