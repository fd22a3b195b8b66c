"""Several Routers over one etcd, and agents and callers given all of them (issue #38).

Real processes: an etcd member, two Router processes, the chaos example agent as an SDK process;
a Router is killed with -9, as a crash would.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import time
from pathlib import Path

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.sdk.client import ReachClient, SyncReachClient
from reachmesh.testing import free_port
from tests.etcd.test_processes import EtcdRouters
from tests.helpers import scaled
from tests.procs import wait_for

pytestmark = pytest.mark.etcd


@pytest.fixture
def routers(tmp_path: Path, etcd: EtcdCluster):
    group = EtcdRouters(tmp_path, etcd)
    yield group
    group.stop()


def agent_key_lease(cluster: EtcdCluster, agent_id: str) -> str | None:
    """The etcd lease the agent's registry key is written under, read from etcd itself: a new
    registration would put the key under a new lease."""
    member = cluster.members[0]
    every = {"key": base64.b64encode(b"\0").decode(), "range_end": base64.b64encode(b"\0").decode()}
    answer = httpx.post(f"{member.client_url}/v3/kv/range", json=every, timeout=10).json()
    for kv in answer.get("kvs", []):
        if base64.b64decode(kv["key"]).decode().endswith(f"/agents/{agent_id}"):
            return str(kv.get("lease"))
    return None


def two_routers(routers: EtcdRouters) -> tuple[list[str], list]:
    ports = [free_port(), free_port()]
    procs = [routers.router(port, log=f"router{i}") for i, port in enumerate(ports)]
    return [f"http://127.0.0.1:{port}" for port in ports], procs


def test_an_agent_keeps_its_lease_through_the_death_of_its_router(routers, etcd):
    """Registered through A, A killed -9: listed at B with the same lease through two lease
    periods, never unlisted, never registering again; calls through B reach it."""
    (url_a, url_b), (router_a, _) = two_routers(routers)
    agent = routers.agent("steady", f"{url_a},{url_b}")
    assert f"attached to Router at {url_a}" in agent.text()
    wait_for(lambda: routers.http.get(f"{url_b}/admin/agents/steady").status_code == 200, timeout=15)
    lease = agent_key_lease(etcd, "steady")
    assert lease is not None
    router_a.signal(signal.SIGKILL)
    router_a.popen.wait()
    killed_at = time.monotonic()
    ttl = scaled(3)
    heartbeats: set[str] = set()
    calls = 0
    # Two whole lease periods (and more) after the kill, watched without a gap.
    while time.monotonic() - killed_at < 2.5 * ttl:
        row = routers.http.get(f"{url_b}/admin/agents/steady")
        assert row.status_code == 200, f"unlisted at B {time.monotonic() - killed_at:.2f} s after the kill"
        assert row.json()["status"] == "available", row.json()
        heartbeats.add(row.json()["lastHeartbeat"])
        assert agent_key_lease(etcd, "steady") == lease
        assert routers.call(url_b) == "SUCCESS"
        calls += 1
    text = agent.text()
    print(f"{calls} calls through B, {len(heartbeats)} heartbeats seen, over {2.5 * ttl:.1f} s")
    # Renewed at B meanwhile (at least one renewal per third of the TTL), on the same lease.
    assert len(heartbeats) >= 3
    assert f"attached to Router at {url_b}" in text
    assert text.count("registration successful") == 1
    assert "registering again" not in text and "HTTP 409" not in text


def test_a_client_given_both_routers_answers_while_either_is_down(routers: EtcdRouters) -> None:
    """ReachClient and SyncReachClient with A,B: answers with A down, then with B down."""
    (url_a, url_b), (router_a, router_b) = two_routers(routers)
    routers.agent("steady", f"{url_a},{url_b}")
    for url in (url_a, url_b):

        def routable(url: str = url) -> bool:
            return routers.call(url) == "SUCCESS"

        wait_for(routable, timeout=15)
    both = f"{url_a},{url_b}"

    async def calls(n: int) -> list[str]:
        async with ReachClient(both) as client:
            return [(await client.call("chaos")).status for _ in range(n)]

    def sync_calls(n: int) -> list[str]:
        with SyncReachClient(both) as client:
            return [client.call("chaos").status for _ in range(n)]

    assert set(asyncio.run(calls(5))) == {"SUCCESS"}
    router_a.signal(signal.SIGKILL)
    router_a.popen.wait()
    assert set(asyncio.run(calls(5))) == {"SUCCESS"}
    assert set(sync_calls(5)) == {"SUCCESS"}
    # A back (on its port), B down: the clients go to A.
    port_a = int(url_a.rsplit(":", 1)[1])
    routers.router(port_a, log="router0-again")
    router_b.signal(signal.SIGKILL)
    router_b.popen.wait()
    wait_for(lambda: routers.call(url_a) == "SUCCESS", timeout=20, what="the agent routable at A again")
    assert set(asyncio.run(calls(5))) == {"SUCCESS"}
    assert set(sync_calls(5)) == {"SUCCESS"}
