"""Async answers are delivered with backoff over a window, and nothing accepted vanishes on shutdown."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from reachmesh.config import AsyncPolicy
from reachmesh.dispatch.asyncmode import AsyncRequests
from reachmesh.dispatch.results import ResultStore
from reachmesh.exceptions import RegistryUnavailable
from reachmesh.registry.etcdclient import EtcdRejected
from reachmesh.testing import FakeTransport, ManualClock
from tests.helpers import until

LISTENER = "http://caller.test/replies"


class Sleeper:
    """An injected sleep that moves the manual clock and wakes listeners whose outage is over."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)
        await asyncio.sleep(0)


def requests(policy: AsyncPolicy, fake: FakeTransport, clock: ManualClock, sleeper: Sleeper) -> AsyncRequests:
    return AsyncRequests(fake, ResultStore(policy, clock=clock), policy, clock=clock, sleep=sleeper)


async def test_listener_down_for_30_seconds_then_back_gets_its_result() -> None:
    """The replyTo listener refuses for 30 s; delivery backs off, then lands once it is back."""
    clock = ManualClock()
    fake = FakeTransport(clock)
    listener = fake.endpoint(LISTENER, healthy=False)
    back_at = clock.monotonic() + 30
    sleeper = Sleeper(clock)

    async def sleep_then_maybe_heal(seconds: float) -> None:
        await sleeper(seconds)
        listener.healthy = clock.monotonic() >= back_at

    runner = AsyncRequests(
        fake, ResultStore(AsyncPolicy(), clock=clock), AsyncPolicy(), clock=clock, sleep=sleep_then_maybe_heal
    )
    delivered = await runner.deliver("t-30", LISTENER, b'{"status":"SUCCESS"}')
    assert delivered
    assert listener.delivered == [b'{"status":"SUCCESS"}']
    # Exponential: each wait at least as long as half the previous ceiling, never over the cap.
    assert len(sleeper.waits) >= 4
    assert all(0.25 <= w <= 30 for w in sleeper.waits)
    assert sleeper.waits[3] > sleeper.waits[0]
    assert 30 <= clock.monotonic() - (back_at - 30) <= 30 + 30


async def test_delivery_gives_up_after_the_window_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A listener that never comes back: attempts stop at the window, with one error line."""
    clock = ManualClock()
    fake = FakeTransport(clock)
    fake.endpoint(LISTENER, healthy=False)
    sleeper = Sleeper(clock)
    policy = AsyncPolicy(reply_window_seconds=120)
    runner = requests(policy, fake, clock, sleeper)
    started = clock.monotonic()
    with caplog.at_level(logging.ERROR, logger="reachmesh.async"):
        assert not await runner.deliver("t-gone", LISTENER, b"{}")
    assert clock.monotonic() - started <= 120
    assert sum(sleeper.waits) > 60  # it kept trying for most of the window, not 0.6 s
    assert any("t-gone" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)


async def test_drain_lets_running_requests_finish_and_abandons_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On shutdown: finished ones are delivered; the rest are logged, stored and sent TIMEOUT."""
    clock = ManualClock()
    fake = FakeTransport(clock)
    listener = fake.endpoint(LISTENER)
    results = ResultStore(AsyncPolicy(), clock=clock)
    runner = AsyncRequests(fake, results, AsyncPolicy(), clock=clock)
    release = asyncio.Event()

    def job(trace_id: str, fast: bool):
        async def run() -> tuple[int, bytes]:
            if not fast:
                await release.wait()  # never set: still running at the deadline
            return 200, orjson.dumps({"traceId": trace_id, "status": "SUCCESS"})

        return run

    for i in range(5):
        runner.start(f"job-{i}", job(f"job-{i}", fast=i < 2), LISTENER)
    await until(lambda: len(listener.delivered) == 2, "the two fast jobs' deliveries")
    with caplog.at_level(logging.ERROR, logger="reachmesh.async"):
        await runner.drain(0.05)
    statuses = sorted(orjson.loads(body)["status"] for body in listener.delivered)
    assert statuses == ["SUCCESS", "SUCCESS", "TIMEOUT", "TIMEOUT", "TIMEOUT"]
    for i in range(5):
        stored = results.get(f"job-{i}")
        assert stored is not None
        assert orjson.loads(stored[1])["status"] == ("SUCCESS" if i < 2 else "TIMEOUT")
    abandoned = {r.getMessage().split("]")[0][1:] for r in caplog.records if "abandoned" in r.getMessage()}
    assert abandoned == {"job-2", "job-3", "job-4"}
    assert len(runner) == 0


class CountingTransport(FakeTransport):
    """Counts every POST to replyTo, refused or not, and the bytes sent."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.tries: list[tuple[str, int]] = []

    async def deliver(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        self.tries.append((headers["X-Reach-Trace-Id"], len(body)))
        await super().deliver(url, body, headers, timeout_s)


async def test_a_delivery_holds_no_copy_and_stops_once_the_store_lets_the_result_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Retrying deliveries once kept whole answers beyond the store's byte budget (262 MiB held
    while the gauge read 16). Each try now reads the store; an evicted result is not sent again."""
    clock = ManualClock()
    fake = CountingTransport(clock)
    fake.endpoint(LISTENER, healthy=False)
    policy = AsyncPolicy(max_result_bytes=4096)
    parked = asyncio.Event()

    async def park(seconds: float) -> None:
        clock.advance(seconds)
        await parked.wait()

    runner = AsyncRequests(fake, ResultStore(policy, clock=clock), policy, clock=clock, sleep=park)

    async def answer() -> tuple[int, bytes]:
        return 200, b"a" * 3000

    runner.start("first", answer, LISTENER)
    await until(lambda: len(fake.tries) == 1, "the first try")
    runner.start("second", answer, None)  # 6,000 bytes > 4,096: "first" is evicted
    await until(lambda: runner.results.get("second") is not None, "the second result")
    assert runner.results.get("first") is None
    with caplog.at_level(logging.ERROR, logger="reachmesh.async"):
        parked.set()
        await until(lambda: not runner._deliveries, "the delivery to end")
    assert fake.tries == [("first", 3000)]
    assert any("no longer held" in r.getMessage() for r in caplog.records)


async def test_deliveries_past_the_pending_bound_get_one_try() -> None:
    clock = ManualClock()
    fake = CountingTransport(clock)
    fake.endpoint(LISTENER, healthy=False)
    policy = AsyncPolicy(max_pending_replies=2, reply_attempts=5)
    parked = asyncio.Event()

    async def park(seconds: float) -> None:
        await parked.wait()

    runner = AsyncRequests(fake, ResultStore(policy, clock=clock), policy, clock=clock, sleep=park)

    async def answer() -> tuple[int, bytes]:
        return 200, b"{}"

    for i in range(5):
        runner.start(f"r{i}", answer, LISTENER)
    await until(lambda: len(fake.tries) == 5, "one try each")
    parked.set()
    await until(lambda: not runner._deliveries, "every delivery to end")
    tries = {trace: sum(1 for t, _ in fake.tries if t == trace) for trace in (f"r{i}" for i in range(5))}
    assert sorted(tries.values()) == [1, 1, 1, 5, 5]  # two retried to the end, three tried once
    assert AsyncPolicy().reply_attempts == 10


class _Journal:
    """The etcd journal's part that finishing uses: etcd out of reach, then refusing the write."""

    def __init__(self) -> None:
        self.refuse = False
        self.released: list[str] = []

    async def finish(self, trace_id: str, *args: object) -> bool:
        if self.refuse:
            raise EtcdRejected(3, "etcdserver: request is too large")
        raise RegistryUnavailable("etcd did not answer within 1 s")

    async def release(self, trace_id: str) -> None:
        self.released.append(trace_id)


async def test_a_result_etcd_then_refuses_is_kept_here_and_its_job_dropped() -> None:
    """A result etcd did not take (out of reach) waits to be written; when etcd then refuses it
    (too large, a role), settling gives up on it, keeps it here and drops its job, rather than
    raising at every look (which read as etcd lost, and kept the adopter from adopting)."""
    journal = _Journal()
    results = ResultStore(AsyncPolicy())
    requests = AsyncRequests(FakeTransport(), results, AsyncPolicy(), journal=journal)  # type: ignore[arg-type]

    async def run() -> tuple[int, bytes]:
        return 200, b'{"status": "SUCCESS"}'

    requests.start("t1", run, None)
    # Finished, and its release tried (a task of its own: busy until it ends), and held back:
    # the result is not in etcd yet.
    await until(lambda: results.get("t1") is not None and not requests.busy("t1"), "t1 finished")
    assert journal.released == []
    journal.refuse = True
    await requests.settle()
    assert journal.released == ["t1"]
    assert results.get("t1") is not None
    await requests.settle()  # nothing left
    assert journal.released == ["t1"]
