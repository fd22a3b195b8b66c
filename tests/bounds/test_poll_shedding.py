"""Polls of async results (GET /reach/{traceId}) pass the load shedder, counted per client as
POST /reach is.

Found by a reviewer's probe: polls were counted by neither ``limits.max_inflight`` nor
``limits.max_inflight_per_client``, so one client could poll without bound (with etcd, each poll
of an id no Router holds one etcd read on the pool that lease renewals share). Real Router on
loopback; an IPv6 caller's address is given by a stand-in for the network, as loopback has none.
"""

from __future__ import annotations

import asyncio

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import peer_from_header, scaled, until

PER_CLIENT = 2


def _config() -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {
                "loop_lag_ms": 10_000,
                "max_inflight_per_client": PER_CLIENT,
                "retry_after_seconds": 7,
            },
            "timeouts": {"read_ms": 120_000},
        }
    )


def _client(router: RouterServer, address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=router.url, timeout=scaled(60), transport=httpx.AsyncHTTPTransport(local_address=address)
    )


async def _hold_slots(
    router: RouterServer, http: httpx.AsyncClient, agent: FakeAgent, headers: dict[str, str]
) -> list[asyncio.Task[httpx.Response]]:
    """``PER_CLIENT`` calls of ``http``'s client held at ``agent``: every slot it may have."""
    assert (await http.post("/agents", json=agent.profile())).status_code == 201
    body = {"targetTask": "slow", "preferences": {"timeoutMs": 120_000}}
    calls = [asyncio.create_task(http.post("/reach", json=body, headers=headers)) for _ in range(PER_CLIENT)]
    await until(lambda: router.app.parts.shedder.inflight == PER_CLIENT, "the client's calls in flight")
    return calls


async def test_a_client_holding_its_share_is_refused_a_poll_while_another_is_served() -> None:
    """Client A holds its ``max_inflight_per_client`` calls at an agent: its poll is 429 OVERLOADED
    with Retry-After, client B's poll is served; once A's calls end, A's poll is served too."""
    async with RouterServer(_config()) as router:
        hog, other = _client(router, "127.0.0.2"), _client(router, "127.0.0.3")
        release = asyncio.Event()
        agent = await FakeAgent("held", tasks=("slow",), hold=release).start()
        try:
            held = await _hold_slots(router, hog, agent, {})
            refused = await hog.get("/reach/some-trace")
            assert refused.status_code == 429
            assert refused.json()["status"] == "OVERLOADED"
            assert refused.json()["traceId"] == "some-trace"
            assert refused.json()["error"]["retryAfterSeconds"] == 7
            assert refused.headers["retry-after"] == "7"
            served = await other.get("/reach/some-trace")
            assert (served.status_code, served.json()["error"]["code"]) == (404, "NOT_FOUND")
            release.set()
            answers = await asyncio.gather(*held)
            assert {a.json()["status"] for a in answers} == {"SUCCESS"}
            assert router.app.parts.shedder.inflight == 0, "a served poll gives its slot back"
            assert (await hog.get("/reach/some-trace")).status_code == 404
        finally:
            release.set()
            await agent.stop()
            await hog.aclose()
            await other.aclose()


async def test_a_poll_is_counted_against_the_ipv6_callers_whole_64_as_its_calls_are() -> None:
    """The poll's client is the /reach calls' client: another address of the same /64 is refused,
    one of another /64 served."""
    async with (
        RouterServer(_config(), middleware=peer_from_header) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(60)) as http,
    ):
        release = asyncio.Event()
        agent = await FakeAgent("held", tasks=("slow",), hold=release).start()
        try:
            held = await _hold_slots(router, http, agent, {"X-Test-Peer": "2001:db8:1:2::1"})
            same_64 = await http.get("/reach/t", headers={"X-Test-Peer": "2001:db8:1:2:ffff::9"})
            assert (same_64.status_code, same_64.json()["status"]) == (429, "OVERLOADED")
            other_64 = await http.get("/reach/t", headers={"X-Test-Peer": "2001:db8:1:3::1"})
            assert other_64.status_code == 404
            release.set()
            assert {a.json()["status"] for a in await asyncio.gather(*held)} == {"SUCCESS"}
        finally:
            release.set()
            await agent.stop()
