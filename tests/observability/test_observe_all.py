"""The store and the metrics take a turn's records at once: a record that breaks costs only
itself, reported once to ``failed``, and the others count and are kept as one call each had."""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from reachmesh.config import RegistryPolicy
from reachmesh.decision import AttemptRecord, DecisionRecord
from reachmesh.observability.metrics import LiveReadings, RouterMetrics
from reachmesh.observability.traces import TraceStore
from reachmesh.protocol import AgentProfile, Status
from reachmesh.registry.memory import MemoryRegistry


def _record(trace_id: str, duration_ms: float = 2.0) -> DecisionRecord:
    record = DecisionRecord(trace_id=trace_id, task="echo", source="targetTask", started=1.0)
    record.matched_task, record.handler, record.status = "echo", "a1", Status.SUCCESS
    record.attempts.append(AttemptRecord("a1", "SUCCESS", 1.0, span_id="s"))
    record.duration_ms = duration_ms
    return record


def _broken(trace_id: str) -> DecisionRecord:
    record = _record(trace_id)
    record.attempts.append("not an attempt")  # type: ignore[arg-type]
    return record


def _metrics() -> RouterMetrics:
    async def registry() -> MemoryRegistry:
        reg = MemoryRegistry(RegistryPolicy())
        profile = {
            "id": "a1",
            "network": {"endpoint": "http://127.0.0.1:9/a1"},
            "capabilities": [{"task": "echo"}],
        }
        await reg.register(AgentProfile.model_validate(profile))
        return reg

    return RouterMetrics(asyncio.run(registry()), LiveReadings(lambda _a: 0, lambda _a: 0, lambda: 0))


def _shown(metrics: RouterMetrics) -> str:
    # _created holds wall-clock times of first use; every other sample must be the same.
    return re.sub(r"^\w+_created(\{[^}]*\})? \S+$", "", metrics.exposition().decode(), flags=re.MULTILINE)


def test_a_record_that_breaks_in_a_turn_costs_only_itself() -> None:
    turn = [_record("t1", 2.0), _broken("bad"), _record("t2", 40.0), _record("t3", float("nan"))]
    one_by_one, together = _metrics(), _metrics()
    alone, at_once = TraceStore(size=10), TraceStore(size=10)
    for record in turn:
        for observer in (one_by_one, alone):
            with contextlib.suppress(AttributeError):  # the broken record, as it fails alone
                observer(record)
    failed: list[object] = []
    together.observe_all(turn, failed.append)
    at_once.observe_all(turn, failed.append)
    assert failed == [together, at_once]
    assert _shown(together) == _shown(one_by_one)
    assert together.requests.values[("echo", "a1", "SUCCESS")] == 4.0  # the broken one counted, as alone
    assert [h["traceId"] for h in at_once.recent()] == ["t3", "t2", "t1"]
    assert at_once.bytes_held == alone.bytes_held and len(at_once) == 3


def test_a_record_called_alone_raises_its_error() -> None:
    with pytest.raises(AttributeError):
        TraceStore(size=2)(_broken("bad"))
    with pytest.raises(AttributeError):
        _metrics()(_broken("bad"))


@pytest.mark.parametrize(
    ("size", "max_bytes", "turn"),
    [
        (5, 1 << 20, 3),  # full after two turns: the oldest leave for the count alone
        (5, 1 << 20, 7),  # a turn longer than the store
        (50, 1500, 4),  # the bytes bound binds first
        (6, 1900, 5),  # both, by turns
    ],
)
def test_a_turn_keeps_what_one_call_per_record_kept(size: int, max_bytes: int, turn: int) -> None:
    """Whichever bound binds, a turn's hops leave the store as they left it one call at a time:
    the same hops held, the same bytes counted, the same evictions for bytes."""
    records = [_record(f"t{i}", 1.0 + i) for i in range(23)]
    for i in range(0, 23, 4):
        records[i].note("retry", "n" * (40 * i))  # hops of several sizes
    one_by_one = TraceStore(size, max_bytes=max_bytes, max_hop_bytes=4096)
    by_turns = TraceStore(size, max_bytes=max_bytes, max_hop_bytes=4096)
    for i in range(0, len(records), turn):
        for record in records[i : i + turn]:
            one_by_one(record)
        by_turns.observe_all(records[i : i + turn], _never)
        assert list(by_turns._hops) == list(one_by_one._hops)
        assert (by_turns.bytes_held, by_turns.evicted_for_bytes) == (
            one_by_one.bytes_held,
            one_by_one.evicted_for_bytes,
        )
    assert by_turns.bytes_held == sum(map(len, by_turns._hops)) <= max_bytes
    assert one_by_one.evicted_for_bytes or max_bytes > 1 << 19  # the bytes bound was reached


def _never(observer: object) -> None:
    raise AssertionError(f"{observer!r} failed")
