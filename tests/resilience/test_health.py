"""Active health checks against real agents on loopback."""

from __future__ import annotations

import httpx

from reachmesh.clock import ManualClock
from reachmesh.config import HealthPolicy, RouterConfig
from reachmesh.protocol import AgentProfile
from reachmesh.registry import MemoryRegistry
from reachmesh.resilience.probes import HealthChecker, health_url
from reachmesh.testing import FakeAgent, RouterServer
from reachmesh.transport.http import HttpTransport
from tests.helpers import until


async def wait_status(server: RouterServer, agent_id: str, status: str) -> None:
    """Read in process, on the loop the probes run on, so no state between two probes is missed."""

    def reached() -> bool:
        entry = server.app.parts.registry.get(agent_id)
        return entry is not None and entry.status.value == status

    await until(reached, f"{agent_id} to become {status}")


async def test_failing_probes_take_an_agent_out_and_a_success_brings_it_back() -> None:
    """One failed probe: suspect; three: unhealthy and out of routing; one success: available again."""
    config = RouterConfig.from_mapping({"health": {"interval_seconds": 0.1, "timeout_ms": 300, "jitter": 0}})
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url) as http:
        sick = await FakeAgent("sick").start()
        well = await FakeAgent("well").start()
        for agent in (sick, well):
            await agent.register(server.url)
        await until(lambda: sick.health_probes >= 1, "the first health probe of 'sick'")
        sick.healthy = False
        await wait_status(server, "sick", "suspect")
        await wait_status(server, "sick", "unhealthy")
        for _ in range(5):
            body = (await http.post("/reach", json={"targetTask": "echo"})).json()
            assert body["handlerAgentId"] == "well"
        refused = (
            await http.post(
                "/reach", json={"targetTask": "echo", "preferences": {"filterAgentIds": ["sick"]}}
            )
        ).json()
        assert {"agentId": "sick", "reason": "unhealthy", "task": "echo"} in refused["error"]["candidates"]
        sick.healthy = True
        await wait_status(server, "sick", "available")
        metrics = (await http.get("/metrics")).text
        assert 'reach_health_check_failures_total{agent="sick"}' in metrics
        for agent in (sick, well):
            await agent.stop()


async def test_probe_goes_to_the_dedicated_port() -> None:
    """health_url uses health_check.port when the profile has one, else the endpoint's port."""
    registry = MemoryRegistry()
    with_port = AgentProfile.model_validate(
        {
            "id": "a",
            "network": {"endpoint": "http://10.0.0.5:8080/reach"},
            "capabilities": [{"task": "t"}],
            "health_check": {"path": "/hz", "port": 8082},
        }
    )
    without = AgentProfile.model_validate(
        {"id": "b", "network": {"endpoint": "http://h:9000/x"}, "capabilities": [{"task": "t"}]}
    )
    entry_a, _ = await registry.register(with_port)
    entry_b, _ = await registry.register(without)
    assert health_url(entry_a) == "http://10.0.0.5:8082/hz"
    assert health_url(entry_b) == "http://h:9000/healthz"


async def test_first_probes_of_a_burst_are_spread() -> None:
    """A thousand agents registered at once get their first probes spread over the interval."""
    clock = ManualClock()
    registry = MemoryRegistry(clock=clock)
    checker = HealthChecker(registry, HttpTransport(), HealthPolicy(interval_seconds=10), clock=clock)
    for i in range(1000):
        await registry.register(
            AgentProfile.model_validate(
                {
                    "id": f"a{i}",
                    "network": {"endpoint": f"http://127.0.0.1:9/{i}"},
                    "capabilities": [{"task": "t"}],
                }
            )
        )
    due = sorted(t - clock.monotonic() for t in checker._due.values())
    assert len(due) == 1000
    assert due[0] >= 1.0 and due[-1] <= 10.0
    # No millisecond holds more than a handful of first probes.
    buckets: dict[int, int] = {}
    for d in due:
        buckets[int(d * 1000)] = buckets.get(int(d * 1000), 0) + 1
    assert max(buckets.values()) <= 5
