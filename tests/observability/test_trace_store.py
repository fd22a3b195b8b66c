"""The trace store's ring: bounded, indexed by traceId, and exact for traces of several hops."""

from __future__ import annotations

import sys
import tracemalloc
from decimal import Decimal
from typing import Any

import numpy as np
import orjson

from reachmesh.decision import AttemptRecord, DecisionRecord
from reachmesh.observability.traces import MAX_TREE_DEPTH, TraceStore
from reachmesh.protocol import Status


def _record(trace_id: str, started: float, *, parent: str | None = None, span: str = "") -> DecisionRecord:
    record = DecisionRecord(
        trace_id=trace_id, task="echo", source="targetTask", started=started, parent_span_id=parent
    )
    record.matched_task = "echo"
    record.status = Status.SUCCESS
    record.handler = "a1"
    record.attempts.append(AttemptRecord("a1", "SUCCESS", 1.0, span_id=span or f"{int(started):016x}"))
    return record


def test_eviction_keeps_the_index_exact_for_multi_hop_traces() -> None:
    """Hops of one trace leave the ring oldest first; the trace shrinks, then disappears."""
    store = TraceStore(size=3)
    store(_record("t1", 1.0, span="s1"))
    store(_record("t1", 2.0, parent="s1", span="s2"))
    store(_record("t2", 3.0))
    trace = store.trace("t1")
    assert trace is not None
    assert [hop["hop"] for hop in trace["hops"]] == [0, 1]
    assert trace["tree"][0]["children"][0]["hop"] == 1

    store(_record("t3", 4.0))  # evicts t1's first hop
    assert [h["startedAt"] for h in store.hops("t1")] == [store.hops("t1")[0]["startedAt"]]
    assert len(store.hops("t1")) == 1
    store(_record("t4", 5.0))  # evicts t1's second hop
    assert store.trace("t1") is None
    assert len(store) == 3
    assert [s["traceId"] for s in store.recent()] == ["t4", "t3", "t2"]


def test_a_trace_id_reused_after_eviction_starts_afresh() -> None:
    """A traceId whose hops were all evicted and that comes back holds only its new hop."""
    store = TraceStore(size=2)
    store(_record("t1", 1.0))
    store(_record("t2", 2.0))
    store(_record("t3", 3.0))
    store(_record("t1", 4.0))
    assert len(store.hops("t1")) == 1
    assert store.recent(status="SUCCESS", limit=1)[0]["traceId"] == "t1"
    assert store.hops("unknown") == []


def test_a_value_json_cannot_hold_does_not_lose_the_hop() -> None:
    """An unexpected type in the record (a Decimal score, a numpy float) still leaves the hop stored."""
    store = TraceStore(size=2)
    record = _record("t1", 1.0)
    record.reject("a2", "low_score", score=Decimal("0.25"))  # type: ignore[arg-type]
    record.score = np.float32(0.5)  # type: ignore[assignment]
    store(record)
    hop = store.hops("t1")[0]
    assert hop["decision"]["rejected"] == [{"agentId": "a2", "reason": "low_score", "score": "0.25"}]
    assert hop["decision"]["score"] == 0.5


def test_the_store_holds_its_hops_in_memory_of_their_own_size() -> None:
    """A hop is a few hundred bytes of JSON, and the store counts (and bounds) those bytes; it
    held each in orjson's 4 KiB buffer, so 10,000 hops took 40 MiB where it counted 5."""
    store = TraceStore(size=500)
    records = [_record(f"t{i}", float(i)) for i in range(500)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for record in records:
            store(record)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.bytes_held < 500 * 1024
    # Room for the index (a deque slot and a dict entry per hop) and each bytes object's header.
    assert held < 2 * store.bytes_held, (held, store.bytes_held)


def test_a_held_hop_is_its_bytes_and_nothing_beside_them() -> None:
    """The store keeps no object of the request beside each hop's bytes (its traceId string, in
    a deque and an index, was upkeep on every request). A lookup by traceId still finds exactly
    its hops, and no traceId that merely starts the same."""
    store = TraceStore(size=3)
    trace_id = "".join(["t", "1"])  # an object of this test's own, not an interned constant
    record = _record(trace_id, 1.0)
    before = sys.getrefcount(trace_id)
    store(record)
    store(_record("t10", 2.0))
    store(_record("t", 3.0))
    assert sys.getrefcount(trace_id) == before
    assert [h["traceId"] for h in store.hops("t1")] == ["t1"]
    assert store.trace("t") is not None and store.trace("t1-x") is None


def test_a_store_of_no_hops_builds_none() -> None:
    store = TraceStore(size=0)
    store(_record("t1", 1.0))
    assert len(store) == 0 and store.bytes_held == 0 and store.trace("t1") is None


def _depth(nodes: list[dict[str, Any]]) -> int:
    deepest, level = 0, nodes
    while level:
        deepest += 1
        level = [child for node in level for child in node["children"]]
    return deepest


def _hop_ids(nodes: list[dict[str, Any]]) -> list[int]:
    found, level = [], nodes
    while level:
        found += [node["hop"] for node in level]
        level = [child for node in level for child in node["children"]]
    return sorted(found)


def test_a_chain_of_hundreds_of_nested_hops_still_answers() -> None:
    """A caller that names the last attempt's span as the parent of each next call chains hops
    without end under one traceId: the tree stops nesting at MAX_TREE_DEPTH, every hop is in it
    once, and the trace still encodes (it passed orjson's recursion limit: a bare 500)."""
    store = TraceStore()
    for i in range(300):
        store(_record("deep", float(i + 1), parent=f"{i:016x}" if i else None, span=f"{i + 1:016x}"))
    trace = store.trace("deep")
    assert trace is not None
    assert _depth(trace["tree"]) == MAX_TREE_DEPTH
    assert _hop_ids(trace["tree"]) == list(range(300))
    assert orjson.loads(orjson.dumps(trace))["hops"][299]["parentSpanId"] == f"{299:016x}"
    cut = trace["hops"][MAX_TREE_DEPTH]
    assert "parentHop" not in cut and cut["parentSpanId"] == f"{MAX_TREE_DEPTH:016x}"
    assert trace["hops"][MAX_TREE_DEPTH + 1]["parentHop"] == MAX_TREE_DEPTH


def test_hops_that_name_each_other_as_parents_are_each_shown_once() -> None:
    store = TraceStore()
    store(_record("loop", 1.0, parent="000000000000000b", span="000000000000000a"))
    store(_record("loop", 2.0, parent="000000000000000a", span="000000000000000b"))
    trace = store.trace("loop")
    assert trace is not None
    assert _hop_ids(trace["tree"]) == [0, 1]
    assert len(trace["tree"]) == 1
