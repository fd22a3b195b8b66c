"""The ReachResponse the encoder writes from a concluded record."""

from __future__ import annotations

import orjson

from reachmesh.clock import ManualClock
from reachmesh.decision import AttemptRecord, DecisionRecord
from reachmesh.dispatch import encoder


def test_each_attempt_is_written_as_its_wire_form() -> None:
    """The answer's attempts are each AttemptRecord.to_wire(), in order, failures too."""
    clock = ManualClock()
    record = DecisionRecord(trace_id="t-1", task="echo", source="-", started=clock.monotonic())
    record.attempts.append(AttemptRecord("a", "CONNECT_ERROR", 1.5, "00f067aa0ba902b7", 0.0, 0.9))
    record.attempts.append(AttemptRecord("b", "SUCCESS", 2.25, "00f067aa0ba902b8", 1.5))
    encoder.conclude(record, clock, result={"ok": True})
    status, body = encoder.encode(record)
    answer = orjson.loads(body)
    assert status == 200 and answer["status"] == "SUCCESS" and answer["result"] == {"ok": True}
    assert answer["attempts"] == [attempt.to_wire() for attempt in record.attempts]
