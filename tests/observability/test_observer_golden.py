"""What the trace store and the metrics show for a fixed run of records, byte for byte the same
as before their per-request work was cut (the golden file was written by the tree at 3360d7b).

The records cover every part a hop or a metric reads: candidates past the shown limit, rejections
with scores and an agent's words, a semantic match with score factors, retries, failovers and a
breaker trip, a stream, a slot wait, a hop over its byte bound, a trace of two hops, and traceIds
that need escaping in JSON or share a prefix. To write the file again from another tree:

    PYTHONPATH=<its src> .venv/bin/python tests/observability/test_observer_golden.py > \
        tests/observability/golden_observers.json
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from reachmesh.config import RegistryPolicy
from reachmesh.decision import AttemptRecord, DecisionRecord, ObserveAfterTurn, StreamRecord
from reachmesh.observability.metrics import LiveReadings, RouterMetrics
from reachmesh.observability.traces import TraceStore
from reachmesh.protocol import AgentProfile, Status
from reachmesh.registry.memory import MemoryRegistry

GOLDEN = Path(__file__).with_name("golden_observers.json")
TRACE_IDS = [
    "gone",
    "t1",
    "t10",
    't"q\\',
    "t1-child",
    "é-ü",
    "big",
    "refused",
    "streamed",
    "plain",
    "failing",
]


def _plain(i: int, trace_id: str) -> DecisionRecord:
    r = DecisionRecord(
        trace_id=trace_id, task="echo", source="targetTask", started=10.0 + i, started_wall=1.7e9 + i
    )
    r.matched_task, r.rule, r.strategy, r.route_by = "echo", "exact_match", "exact", "exact"
    r.candidates.extend(["a1", "a2"])
    r.selected = r.handler = "a1"
    r.score = 1.0
    r.attempts.append(AttemptRecord("a1", "SUCCESS", 1.25 + i, span_id=f"{i:016x}", offset_ms=0.5))
    r.status, r.http_status, r.duration_ms = Status.SUCCESS, 200, 1.5 + i
    r.pool_wait_ms = 0.123456 if i % 2 else 0.0
    return r


def _failing(i: int) -> DecisionRecord:
    r = _plain(i, "failing")
    r.candidates[:] = [f"agent-{n}" for n in range(30)]  # past the shown limit
    r.reject("a3", "low_score", score=0.01, task="echo")
    r.reject("a4", "declined", task="echo", message="not mine: " + "x" * 400)
    r.attempts.append(AttemptRecord("a2", "timeout", 2.5, span_id="ffff", offset_ms=3.0, score=0.5))
    r.retries.append("connect_error")
    r.failovers.append("timeout")
    r.circuit_trips.extend(["a1", "gone-agent"])
    r.note("retry", "a1, attempt=2")
    r.note("failover", "a1 -> a2 (timeout)")
    r.handler, r.status, r.http_status, r.error_code = None, Status.TIMEOUT, 504, "TIMEOUT"
    r.queue_wait_ms = 7.777777
    return r


def _semantic(i: int) -> DecisionRecord:
    r = DecisionRecord(trace_id="refused", task="find me a price", source="caller-x", started=30.0 + i)
    r.semantic = {"score": 0.05, "threshold": 0.083, "best": "price"}
    r.explain.append({"agentId": "a1", "score": 0.05, "factors": {"load": 1.0}})
    r.semantic_refused = True
    r.strategy, r.score = "semantic", 0.05
    r.status, r.http_status, r.duration_ms = Status.NO_AVAILABLE_HANDLER, 404, 0.75
    return r


def _streamed(i: int) -> DecisionRecord:
    r = _plain(i, "streamed")
    r.mode = "stream"
    r.stream = StreamRecord(first_chunk_ms=2.0, chunks=3, bytes=120, ended="done", marks_ms=[2.0, 3.0, 4.0])
    r.stream.last_chunk_ms = 4.0
    return r


def records() -> list[DecisionRecord]:
    out = [_plain(i, trace_id) for i, trace_id in enumerate(TRACE_IDS[:6])]  # "gone" is evicted
    out[4].parent_span_id = f"{1:016x}"  # a hop of t1's first attempt: one trace of two hops
    out[4].trace_id = "t1"
    big = _plain(5, "big")
    for n in range(40):
        big.note("retry", f"{n}:" + "n" * 2000)
    out += [big, _semantic(6), _streamed(7), _failing(8), _plain(9, "plain")]
    unknown = _plain(10, "plain")
    unknown.matched_task, unknown.handler, unknown.status = "nobody-declares-this", "left-agent", None
    out.append(unknown)
    return out


async def _registry() -> MemoryRegistry:
    registry = MemoryRegistry(RegistryPolicy())
    for agent_id in ("a1", "a2"):
        profile = {
            "id": agent_id,
            "network": {"endpoint": f"http://127.0.0.1:9/{agent_id}"},
            "capabilities": [{"task": "echo"}],
        }
        await registry.register(AgentProfile.model_validate(profile))
    return registry


async def _one_turn(observe: ObserveAfterTurn) -> None:
    for record in records():
        observe(record)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(done.set_result, None)  # after the run already due at the end of this turn
    await done


def _without_created(text: bytes) -> str:
    # _created holds wall-clock times of first use; everything else must be equal byte for byte.
    return re.sub(r"^(\w+_created(?:\{[^}]*\})?) \S+$", r"\1 T", text.decode(), flags=re.MULTILINE)


def observe(*, in_one_turn: bool = False) -> dict[str, Any]:
    """Every record through a store and the metrics; what their readers show. ``in_one_turn``:
    the records finish in one turn of a loop and are observed together at its end."""
    registry = asyncio.run(_registry())
    metrics = RouterMetrics(registry, LiveReadings(lambda _a: 0, lambda _a: 0, lambda: 0))
    store = TraceStore(11, max_bytes=1 << 20, max_hop_bytes=16 * 1024)
    if in_one_turn:
        failed: list[object] = []
        asyncio.run(_one_turn(ObserveAfterTurn([metrics, store], failed.append)))
        assert failed == []
    else:
        for record in records():
            metrics(record)
            store(record)
    return {
        "traces": {trace_id: store.trace(trace_id) for trace_id in [*TRACE_IDS, "t", "unknown"]},
        "hops": {trace_id: store.hops(trace_id) for trace_id in TRACE_IDS},
        "recent": store.recent(),
        "recent_filtered": [store.recent(task="echo", limit=3), store.recent(status="TIMEOUT")],
        "held": [len(store), store.bytes_held, store.slimmed, store.evicted_for_bytes],
        "metrics": _without_created(metrics.exposition()),
    }


def test_the_store_and_metrics_show_what_they_showed_before() -> None:
    _assert_golden(observe())


def test_records_finished_in_one_turn_show_the_same_observed_together() -> None:
    """The end of the loop's turn hands every record of the turn to the store and the metrics
    in one call each (their ``observe_all``): what they show is what one call per record showed."""
    _assert_golden(observe(in_one_turn=True))


def _assert_golden(observed: dict[str, Any]) -> None:
    got = json.loads(json.dumps(observed))
    want = json.loads(GOLDEN.read_text())
    assert got["metrics"] == want["metrics"]
    for key in ("traces", "hops", "recent", "recent_filtered", "held"):
        assert got[key] == want[key], key


if __name__ == "__main__":
    json.dump(observe(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
