"""Health checks: a floor on the interval an agent may ask for, one probe per agent, none left behind."""

from __future__ import annotations

import asyncio
import time

import httpx

from reachmesh.config import RouterConfig
from reachmesh.resilience.probes import HealthChecker
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled

# Each probe's timeout: 200 ms on a quiet machine; the healthy canary on a busy one may answer later.
PROBE_MS = int(scaled(200))


def profile(agent_id: str, endpoint: str, interval: float = 15) -> dict[str, object]:
    return {
        "id": agent_id,
        "network": {"endpoint": endpoint},
        "capabilities": [{"task": "hang"}],
        "health_check": {"interval_seconds": interval},
    }


async def test_an_interval_under_a_second_is_refused_naming_the_field() -> None:
    """0.0001 s: 422 INVALID_PROFILE at health_check.interval_seconds; 1 s is accepted."""
    config = RouterConfig.from_mapping({"embedding": {"backend": "none"}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        resp = await http.post("/agents", json=profile("fast", "http://127.0.0.1:9/r", 0.0001))
        assert resp.status_code == 422
        [detail] = resp.json()["error"]["details"]
        assert detail["field"] == "health_check.interval_seconds" and "1" in detail["message"]
        resp = await http.post("/agents", json=profile("steady", "http://127.0.0.1:9/r", 1))
        assert resp.status_code == 201


async def hanging_server() -> tuple[asyncio.Server, int]:
    """Accepts connections and never answers: every probe to it runs to its timeout."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()
        finally:
            writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def poll(check: object, limit_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(limit_s)
    while loop.time() < deadline:
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_one_probe_per_agent_a_canary_is_still_probed_and_nothing_is_left_behind() -> None:
    """Ten agents that never answer their probes, probed every 20 ms (the operator's override, far
    under each probe's 200 ms (scaled) timeout) through a gate of two: at most one probe per agent is ever
    in flight, a healthy canary keeps being probed, deregistration releases the probes, and
    the Router stops at once."""
    config = RouterConfig.from_mapping(
        {
            "embedding": {"backend": "none"},
            "limits": {"loop_lag_ms": 10_000},
            "health": {"interval_seconds": 0.02, "timeout_ms": PROBE_MS, "jitter": 0, "concurrency": 2},
            # Far above the stop bound below: a stop that waited for the drain would fail it.
            "server": {"drain_timeout_seconds": 60},
        }
    )
    hang, port = await hanging_server()
    canary = await FakeAgent("canary").start()
    router = RouterServer(config)
    await router.__aenter__()
    checker: HealthChecker = router.app.parts.health
    try:
        async with httpx.AsyncClient(base_url=router.url, timeout=10) as http:
            leases = {}
            for i in range(10):
                resp = await http.post("/agents", json=profile(f"hang-{i}", f"http://127.0.0.1:{port}/r"))
                leases[f"hang-{i}"] = resp.json()["leaseId"]
            await canary.register(router.url, vectors=False)
            seen_in_flight = 0
            loop = asyncio.get_running_loop()
            start_probes = canary.health_probes
            # At least 1.5 s of the attack, and until the canary has been probed twice more
            # (about once a second here: ten 200 ms probes through a gate of two; scaled on CI).
            watch_from, deadline = loop.time(), loop.time() + scaled(15)
            while loop.time() - watch_from < 1.5 or canary.health_probes - start_probes < 2:
                assert loop.time() < deadline, f"the canary got {canary.health_probes - start_probes} probes"
                seen_in_flight = max(seen_in_flight, checker.probes_in_flight, len(checker._probes))
                await asyncio.sleep(0.01)
            assert seen_in_flight <= 11
            assert (await http.post("/reach", json={"targetTask": "echo"})).json()["status"] == "SUCCESS"
            for agent_id, lease in leases.items():
                resp = await http.delete(f"/agents/{agent_id}", headers={"X-Reach-Lease": lease})
                assert resp.status_code in (200, 204), resp.text
            await poll(lambda: checker.probes_in_flight <= 1 and len(checker._probes) <= 1)
            # And it stays so over a few more turns of the schedule (checked all along).
            settled_until = loop.time() + 0.5
            while loop.time() < settled_until:
                assert len(checker._probes) <= 1
                await asyncio.sleep(0.02)
    finally:
        started = time.monotonic()
        await router.__aexit__(None, None, None)
        stopped_in = time.monotonic() - started
        await canary.stop()
        hang.close()
    assert stopped_in < scaled(5), stopped_in
