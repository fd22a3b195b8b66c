"""The ``burst`` drill: an orchestrator's fan-out at slow agents. Busy is not broken.

Every agent answers after :data:`BURST_HOLD_MS` and declares ``max_concurrency``
:data:`BURST_CAPACITY`; ``--rate`` x :data:`BURST_SECONDS` calls are sent at once, more than the
fleet can hold. The Router must queue the excess, never exceed an agent's capacity, answer every
call, and open no breaker: the agents were only busy.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import httpx

from reachmesh.cli.drill.fleet import Fleet, ViewPoller, auth_headers
from reachmesh.cli.drill.load import Load, Sample, summary

BURST_HOLD_MS = 1000
BURST_CAPACITY = 20
BURST_SECONDS = 10  # calls = rate x this, sent at once
BURST_BUDGET_MS = 60_000


def burst_policy() -> dict[str, Any]:
    """The drill's own Router admits the whole burst: the queue under test is the per-agent one."""
    return {"limits": {"max_inflight": 8192, "max_inflight_per_client": 8192}}


async def run_burst(
    fleet: Fleet, router_url: str, token: str | None, agents: int, rate: float
) -> tuple[dict[str, Any], list[tuple[str, bool, str]], list[Sample]]:
    """The figures, the promises (name, held, detail) and the samples of one burst."""
    fleet.max_concurrency = BURST_CAPACITY
    names = fleet.start(max(agents, 2))
    await fleet.wait_registered(names)
    for name in names:
        fleet.fault(name, delay_ms=BURST_HOLD_MS)
    calls = max(int(rate * BURST_SECONDS), 1)
    started = time.monotonic()
    headers = auth_headers(token)
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(headers=headers, connector=connector) as session,
        httpx.AsyncClient(base_url=router_url, headers=headers, timeout=5) as http,
    ):
        load = Load(
            session,
            router_url,
            fleet.task,
            started,
            budget_ms=BURST_BUDGET_MS,
            read_timeout_ms=BURST_BUDGET_MS,
            max_inflight=calls,
        )
        watcher = ViewPoller(http, fleet.prefix, started)
        watcher.start()
        try:
            await load.burst(calls)
        finally:
            await watcher.stop()
    samples = load.samples
    answered = sum(1 for s in samples if s.ok)
    opened = [name for name in names if watcher.first(name, "circuit", "open") is not None]
    fleet_capacity = BURST_CAPACITY * len(names)
    figures = {
        "calls": calls,
        "agents": len(names),
        "holdMs": BURST_HOLD_MS,
        "capacityPerAgent": BURST_CAPACITY,
        "answered": answered,
        "breakersOpened": opened,
        # The least time the fleet needs for the burst, for comparison with the slowest answer.
        "idealLastMs": -(-calls // fleet_capacity) * BURST_HOLD_MS,
        "overall": summary(samples),
    }
    promises = [
        ("every call answered SUCCESS", answered == calls, f"{answered} of {calls}"),
        ("no breaker opened (busy is not broken)", not opened, ", ".join(opened) or "none opened"),
    ]
    return figures, promises, samples
