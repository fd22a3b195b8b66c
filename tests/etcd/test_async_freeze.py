"""An async request running on Router A while etcd is frozen longer than A's claim lease.

When etcd wakes, A's claim is gone; A notices at its next keepalive and claims its request
again. Before, Router B, which looks for orphans every `adopt_interval_seconds`, could find the
request unclaimed first and run it a second time at the agent (seen in walk 48: one of five
requests adopted by B 30 ms before A claimed it again). Now a Router that has just lost touch
with etcd leaves other Routers' orphans alone for a keepalive tick and two looks.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.helpers import scaled, until

pytestmark = pytest.mark.etcd

# A's claim lease must lapse during the freeze, never before it: a lease that lapses while etcd
# answers B is one B rightly adopts. Both Routers run in this process, so a stall of the process
# (a loaded machine) long enough to lapse a lease of 3 s or more (two thirds of it, past a
# keepalive) also makes B's next look late by more than durable.LATE_LOOK_S, and B leaves the
# request alone. A 2 s lease can lapse after a stall of 1.4 s, which leaves B's look on time: the
# likeliest cause of the one CI run in which B ran the request a second time.
CLAIM_TTL_S = max(3, round(scaled(2)))


async def test_after_etcd_was_frozen_the_running_router_keeps_its_request(
    etcd: EtcdCluster, client: httpx.AsyncClient
) -> None:
    hold = asyncio.Event()
    agent = await FakeAgent("holder", tasks=("hold",), hold=hold).start()
    owner_policy = etcd_policy(
        etcd,
        async_mode={"adopt_interval_seconds": 0.5, "claim_ttl_seconds": CLAIM_TTL_S},
        health={"enabled": False},
        timeouts={"read_ms": 120_000},
    )
    # B's own claim lease outlives the freeze, and it looks for orphans every 50 ms: on the
    # old code it found A's request unclaimed as soon as etcd woke, every time.
    other_policy = etcd_policy(
        etcd,
        async_mode={"adopt_interval_seconds": 0.05, "claim_ttl_seconds": 60},
        health={"enabled": False},
        timeouts={"read_ms": 120_000},
    )
    try:
        async with RouterServer(owner_policy) as a, RouterServer(other_policy) as b:
            await agent.register(a.url, vectors=False)
            body = {"targetTask": "hold", "preferences": {"mode": "async", "timeoutMs": 120_000}}
            accepted = await client.post(f"{a.url}/reach", json=body)
            assert accepted.status_code == 202
            trace_id = accepted.json()["traceId"]
            await until(lambda: agent.received, "the request held at the agent")
            journal = a.app.parts.dispatcher.async_requests.journal
            assert journal is not None
            _, claim = await journal.client.get(journal.claims + trace_id)
            assert claim is not None
            first_lease = claim.lease

            member = etcd.members[0]
            member.freeze()
            try:
                # Longer than A's claim lease (wall time: etcd's lease clock runs on).
                await asyncio.sleep(CLAIM_TTL_S + 2)
            finally:
                member.thaw()

            async def claimed_again() -> int | None:
                _, held = await journal.client.get(journal.claims + trace_id)
                if held is None or held.lease == first_lease:
                    return None
                assert held.value == journal.router.encode(), "claimed by B, not again by A"
                return held.lease

            await until(claimed_again, "the request claimed again by A", within=30)
            hold.set()

            async def finished() -> bool:
                resp = await client.get(f"{b.url}/reach/{trace_id}")
                return resp.status_code == 200 and resp.json()["status"] == "SUCCESS"

            await until(finished, "the result readable at B", within=30)
            assert b.app.parts.adopter is not None and b.app.parts.adopter.adopted == 0, "B adopted it"
            assert len(agent.received) == 1, "the request ran twice at the agent"
            assert a.app.parts.adopter is not None and a.app.parts.adopter.adopted == 0
    finally:
        await agent.stop()
