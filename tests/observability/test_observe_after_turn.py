"""The lane's records are observed at the end of the loop's turn: every one, in order, each
observer over all of them, none lost to another observer's bug."""

from __future__ import annotations

import asyncio

from reachmesh.decision import DecisionRecord, ObserveAfterTurn, Observer


async def _after_this_turn() -> None:
    """Return once the callbacks already scheduled on the loop have run (they come first)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    await done


def _record(trace_id: str) -> DecisionRecord:
    return DecisionRecord(trace_id=trace_id, task="echo", source="targetTask", started=0.0)


def test_records_are_observed_together_at_the_end_of_the_turn_observer_by_observer() -> None:
    seen: list[tuple[str, str]] = []
    failed: list[object] = []

    def first(record: DecisionRecord) -> None:
        seen.append(("first", record.trace_id))

    def broken(record: DecisionRecord) -> None:
        raise RuntimeError("an observer's bug")

    def last(record: DecisionRecord) -> None:
        seen.append(("last", record.trace_id))

    observers: list[Observer] = [first, broken, last]
    observe = ObserveAfterTurn(observers, failed.append)

    async def main() -> None:
        observe(_record("t1"))
        observe(_record("t2"))
        assert seen == []  # not in the caller's turn
        await _after_this_turn()
        assert seen == [("first", "t1"), ("first", "t2"), ("last", "t1"), ("last", "t2")]
        assert failed == [broken, broken]
        observe(_record("t3"))  # a later turn gets a run of its own
        await _after_this_turn()
        assert seen[-2:] == [("first", "t3"), ("last", "t3")]

    asyncio.run(main())


def test_outside_a_loop_and_across_loops_nothing_is_left_pending() -> None:
    seen: list[str] = []
    observe = ObserveAfterTurn([lambda r: seen.append(r.trace_id)], lambda _o: None)
    observe(_record("now"))
    assert seen == ["now"]

    async def observe_and_return() -> None:
        observe(_record("due"))

    loop = asyncio.new_event_loop()
    loop.run_until_complete(observe_and_return())  # the loop's last turn runs what is due
    loop.close()
    assert seen == ["now", "due"]

    async def next_loop() -> None:
        observe(_record("next"))
        await _after_this_turn()

    asyncio.run(next_loop())  # a run is due on the new loop, not on the closed one
    assert seen == ["now", "due", "next"]


class _TakesTurns:
    """An observer that also takes a turn's records at once."""

    def __init__(self, broken: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.broken = broken

    def __call__(self, record: DecisionRecord) -> None:
        self.calls.append(["one", record.trace_id])

    def observe_all(self, records: list[DecisionRecord], failed: object) -> None:
        self.calls.append([record.trace_id for record in records])
        if self.broken:
            raise RuntimeError("a bug past its own records' handling")


def test_an_observer_that_takes_a_turn_at_once_is_handed_every_record_in_one_call() -> None:
    """The store and the metrics read their state once per turn, not once per record; the other
    observers are still called once per record, and a batch's own bug costs no one else theirs."""
    seen: list[str] = []
    failed: list[object] = []
    whole, broken = _TakesTurns(), _TakesTurns(broken=True)
    observers: list[Observer] = [whole, broken, lambda r: seen.append(r.trace_id)]
    observe = ObserveAfterTurn(observers, failed.append)

    async def main() -> None:
        observe(_record("t1"))
        observe(_record("t2"))
        await _after_this_turn()
        assert whole.calls == [["t1", "t2"]]
        assert broken.calls == [["t1", "t2"]] and failed == [broken]
        assert seen == ["t1", "t2"]
        late = _TakesTurns()
        observers.append(late)  # an observer added later is planned for at the next turn
        observe(_record("t3"))
        observe(_record("t4"))
        await _after_this_turn()
        assert whole.calls[-1] == ["t3", "t4"] and late.calls == [["t3", "t4"]] and seen[-2:] == ["t3", "t4"]
        observe(_record("t5"))  # a turn's only record: one call each, as to any observer
        await _after_this_turn()
        assert whole.calls[-1] == ["one", "t5"] and seen[-1] == "t5"

    asyncio.run(main())
