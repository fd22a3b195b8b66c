"""The agent's lease while the Router is away: backoff with jitter, a quiet log, a quick return.

The keeper runs on a ManualClock that only its waits move, against an in-process Router (an
httpx MockTransport) that refuses connections for a stretch of that clock and then comes back
restarted, with no leases. Nothing sleeps: an hour-long outage runs in milliseconds.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass, field

import httpx
import pytest

from reachmesh.clock import ManualClock
from reachmesh.sdk.lease import BACKOFF_CAP_S, Backoff, LeaseKeeper, span

TTL = 60.0


@dataclass
class FlakyRouter:
    """Refuses connections in [down_from, down_until); comes back restarted, its leases gone."""

    clock: ManualClock
    down_from: float
    down_until: float
    conflict_until: float = 0.0  # answers registrations 409 until then (a live holder elsewhere)
    leases: set[str] = field(default_factory=set)
    registered_at: list[float] = field(default_factory=list)
    attempts: list[tuple[float, str]] = field(default_factory=list)
    probes: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        now = self.clock.monotonic()
        if request.url.path == "/healthz":
            self.probes += 1
        else:
            self.attempts.append((now, request.method))
        if self.down_from <= now < self.down_until:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if now >= self.down_until and self.down_until > 0:
            self.leases.discard("0xbefore")  # restarted: what it knew is gone
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok"})
        if request.method == "POST":
            if now < self.conflict_until:
                error = {"code": "AGENT_ID_CONFLICT", "message": "agent id 'a' is held by a live lease"}
                return httpx.Response(409, json={"error": error})
            lease = "0xbefore" if now < self.down_from else f"0xafter{len(self.registered_at)}"
            self.leases.add(lease)
            self.registered_at.append(now)
            return httpx.Response(201, json={"agentId": "a", "leaseId": lease, "ttlSeconds": TTL})
        lease = str(httpx.Response(200, content=request.content).json()["leaseId"])
        if lease not in self.leases:
            error = {"code": "LEASE_NOT_FOUND", "message": "no live lease for agent 'a'; register again"}
            return httpx.Response(404, json={"error": error})
        return httpx.Response(200, json={"agentId": "a", "leaseId": lease, "ttlSeconds": TTL})


def run(router: FlakyRouter, until: float) -> LeaseKeeper:
    """Register at clock 0 and keep the lease until the clock reaches ``until``."""
    clock = router.clock
    keeper: LeaseKeeper

    def wait(seconds: float) -> bool:
        clock.advance(seconds)
        if clock.monotonic() >= until:
            keeper.stop(wait=0)
        return keeper.stopping

    keeper = LeaseKeeper(
        "http://router", {"id": "a"}, callback="http://a/reach", tasks=["t"], clock=clock, wait=wait
    )
    keeper._http = httpx.Client(transport=httpx.MockTransport(router))
    try:
        assert keeper.register_until_done()
        keeper._renew_forever()  # on this thread: it returns once the clock reaches `until`
    finally:
        keeper.close()
    return keeper


class ClockedRecords(logging.Handler):
    """Notes the ManualClock's reading when each record is emitted."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(logging.DEBUG)
        self.clock = clock
        self.records: list[tuple[float, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:
            self.records.append((self.clock.monotonic(), record))

    def since(self, start: float) -> list[str]:
        return [r.getMessage() for at, r in self.records if at >= start]


@pytest.fixture
def sdk_log():
    logger = logging.getLogger("reachmesh.sdk")
    handlers: list[ClockedRecords] = []

    def attach(clock: ManualClock) -> ClockedRecords:
        handler = ClockedRecords(clock)
        logger.addHandler(handler)
        handlers.append(handler)
        return handler

    previous = logger.level
    logger.setLevel(logging.INFO)
    yield attach
    logger.setLevel(previous)
    for handler in handlers:
        logger.removeHandler(handler)


@pytest.mark.parametrize("seed", range(40))
def test_a_router_down_for_60s_costs_few_lines_and_the_agent_is_back_within_10s(sdk_log, seed) -> None:
    """Router down 60 s, at any phase of the renewals: < 15 lines, registered again within 10 s."""
    random.seed(seed)
    clock = ManualClock(start=0.0)
    down_from = 90.0 + seed * 1.7  # any point between two renewals
    router = FlakyRouter(clock, down_from=down_from, down_until=down_from + 60)
    log = sdk_log(clock)
    run(router, until=down_from + 90)
    back = [t for t in router.registered_at if t >= router.down_until]
    assert back, "never registered again"
    assert back[0] - router.down_until <= 10, f"registered {back[0] - router.down_until:.1f}s after return"
    said = log.since(down_from)
    assert len(said) < 15, said
    assert any("unreachable" in line and "retrying with backoff" in line for line in said)
    assert any("answers again after" in line for line in said)
    assert said[-1].startswith("[reach-client] registration successful")


def test_an_hour_long_outage_backs_off_to_the_cap_and_summarizes(sdk_log) -> None:
    """An hour down: attempts at most about every 15-30 s, one summary a minute, probes silent."""
    random.seed(7)
    clock = ManualClock(start=0.0)
    router = FlakyRouter(clock, down_from=30.0, down_until=30.0 + 3600)
    log = sdk_log(clock)
    run(router, until=router.down_until + 30)
    during = [t for t, _ in router.attempts if router.down_from <= t < router.down_until]
    assert len(during) <= 3600 / (BACKOFF_CAP_S / 2) + 15
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert max(gaps) <= BACKOFF_CAP_S + 0.01
    said = log.since(router.down_from)
    summaries = [line for line in said if "still retrying" in line]
    assert 55 <= len(summaries) <= 61, said
    assert any("unreachable for 2 min, still retrying" in line for line in summaries)
    assert len(said) <= len(summaries) + 10
    assert router.registered_at[-1] - router.down_until <= 10


def test_a_held_id_is_retried_with_backoff_without_flooding(sdk_log) -> None:
    """409 for ten minutes (a live holder elsewhere): the pauses grow to the cap, the log stays short."""
    random.seed(3)
    clock = ManualClock(start=0.0)
    router = FlakyRouter(clock, down_from=1e9, down_until=0.0, conflict_until=600.0)
    log = sdk_log(clock)
    run(router, until=660.0)
    posts = [t for t, method in router.attempts if method == "POST" and t < 600]
    assert len(posts) <= 600 / (BACKOFF_CAP_S / 2) + 10
    assert router.probes == 0  # the Router answers: nothing to probe
    said = log.since(0.0)
    assert len([line for line in said if "AGENT_ID_CONFLICT" in line]) == 1, said
    assert len(said) < 20, said
    assert router.registered_at and router.registered_at[0] >= 600


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    """Pauses from the upper half of each step; steps double to the cap; reset starts over."""
    random.seed(1)
    backoff = Backoff(first=0.25, cap=30)
    pauses = [backoff.next() for _ in range(12)]
    steps = [min(0.25 * 2**i, 30) for i in range(12)]
    assert all(step / 2 <= pause <= step for pause, step in zip(pauses, steps, strict=True))
    assert len({round(p, 6) for p in pauses[-4:]}) == 4  # jittered, not in step
    backoff.reset()
    assert backoff.next() <= 0.25


def test_durations_read_as_people_say_them() -> None:
    assert [span(s) for s in (4.2, 62, 125, 3600, 3900)] == ["4 s", "62 s", "2 min", "1 h", "1 h 5 min"]
