"""End to end with real processes on loopback: a Router and the two demo agents (SDK)."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reachmesh.testing import free_port
from tests.helpers import scaled
from tests.procs import ROOT, Proc, wait_for

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "src" / "reachmesh" / "cli" / "demo"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class Cluster:
    """The Router and the demo agents, each on free ports, with a 2 s lease (scaled).

    The Router runs without an embedder: these tests route by task, and loading the model costs
    each Router start seconds of CPU (test_demo runs the Router with it).
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.policy = tmp / "router.yaml"
        self.policy.write_text(
            yaml.safe_dump(
                {
                    "registry": {
                        # Renewed every third of it, suspect after half: on a busy machine
                        # an agent process may be a third of a second late.
                        "lease_ttl_seconds": scaled(2),
                        "sweep_interval_seconds": 0.05,
                        "offline_grace_seconds": 30,
                    },
                    "embedding": {"backend": "none"},
                }
            )
        )
        self.router: Proc | None = None
        self.agents: dict[str, Proc] = {}
        self.http = httpx.Client(base_url=self.url, timeout=scaled(5))

    def start_router(self) -> Proc:
        self.router = Proc(
            ["router", "--port", str(self.port), "--config", str(self.policy)], self.tmp / "router.log"
        )
        wait_for(lambda: self.http.get("/healthz").status_code == 200)
        return self.router

    def agents_running(self) -> bool:
        """True, or an AssertionError with the output of an agent that exited (a poll ends at once)."""
        return all(proc.running() for proc in self.agents.values())

    def start_agent(self, name: str, folder: str) -> Proc:
        config = yaml.safe_load((EXAMPLES / folder / "reach_config.yaml").read_text())
        config["agent"]["network"]["endpoint"] = f"http://127.0.0.1:{free_port()}/reach"
        config["agent"]["health_check"]["port"] = free_port()
        config["router"] = {"url": self.url}
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, allow_unicode=True))
        proc = Proc(
            ["agent", "--config", str(path), "--app", f"reachmesh.cli.demo.{folder}.agent:agent"],
            self.tmp / f"{name}.log",
        )
        self.agents[name] = proc
        return proc

    def statuses(self) -> dict[str, str]:
        return {row["id"]: row["status"] for row in self.http.get("/admin/agents").json()}

    def reach(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.http.post("/reach", json=body).json()
        return result

    def stop(self) -> None:
        for proc in self.agents.values():
            proc.stop()
        if self.router is not None:
            self.router.stop()
        self.http.close()


DEMO_AVAILABLE = {"price-query-agent": "available", "promotion-agent": "available"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A running Router plus price-query-agent and promotion-agent, all registered."""
    c = Cluster(tmp_path)
    try:
        c.start_router()
        c.start_agent("price-query-agent", "price_agent")
        c.start_agent("promotion-agent", "promotion_agent")
        try:
            wait_for(
                lambda: c.agents_running() and c.statuses() == DEMO_AVAILABLE, what="both agents available"
            )
        except AssertionError as exc:  # say why: each agent's last lines
            tails = "".join(f"\n--- {name}:\n{proc.text()[-1500:]}" for name, proc in c.agents.items())
            raise AssertionError(f"{exc}{tails}") from exc
        yield c
    finally:
        c.stop()


PRICE_CALL = {
    "traceId": "trace-demo-001",
    "sourceAgent": "user-proxy",
    "targetTask": "query_product_price",
    "payload": {"product_id": "SKU-88231", "currency": "CNY"},
}


def test_register_list_and_call(cluster: Cluster) -> None:
    """Registration, /admin/agents, calls by task, by targetAgent and with filterAgentIds all work."""
    rows = cluster.http.get("/admin/agents").json()
    assert {r["id"] for r in rows} == {"price-query-agent", "promotion-agent"}
    for row in rows:
        assert row["status"] == "available"
        assert ISO.match(row["lastHeartbeat"])

    body = cluster.reach(PRICE_CALL)
    assert body["status"] == "SUCCESS"
    assert body["handlerAgentId"] == "price-query-agent"
    assert body["result"]["price"] == 199.9
    assert body["result"]["currency"] == "CNY"
    assert ISO.match(body["result"]["updated_at"])

    # Both agents declare query_promotion; targetAgent and filterAgentIds pin the choice.
    promo = {"targetTask": "query_promotion", "payload": {"product_id": "SKU-88231"}}
    by_target = cluster.reach({**promo, "targetAgent": "price-query-agent"})
    assert by_target["handlerAgentId"] == "price-query-agent"
    filtered = cluster.reach({**promo, "preferences": {"filterAgentIds": ["promotion-agent"]}})
    assert filtered["handlerAgentId"] == "promotion-agent"
    assert filtered["result"]["promotions"]

    assert cluster.router is not None
    router_log = cluster.router.text()
    assert "[trace-demo-001] route: user-proxy -> query_product_price" in router_log
    assert "[trace-demo-001] candidate agents: price-query-agent" in router_log
    assert "[trace-demo-001] select price-query-agent by exact_match" in router_log
    assert re.search(r"\[trace-demo-001\] forward: price-query-agent, duration=\d+ms", router_log)
    # The agent logs its last registration line when the Router's answer arrives, which may be
    # after the Router already routes to it (it is in the registry from the moment it is written).
    wait_for(lambda: "registration successful" in cluster.agents["price-query-agent"].text())
    agent_log = cluster.agents["price-query-agent"].text()
    for line in (
        "[reach-client] registering agent: price-query-agent",
        "[reach-client] capabilities: query_product_price, query_promotion",
        "[reach-client] callback endpoint: http://127.0.0.1:",
        "[reach-client] registration successful, lease id: fp:",
    ):
        assert line in agent_log
    assert "[trace-demo-001] handle: query_product_price from user-proxy" in agent_log


def test_sigterm_deregisters_the_agent(cluster: Cluster) -> None:
    """After SIGTERM the agent deregisters (gone from the registry, not left to expire) and exits 0."""
    promo = {"targetTask": "query_promotion", "payload": {"product_id": "SKU-1"}}
    cluster.agents["promotion-agent"].signal(signal.SIGTERM)
    # Gone, not offline: an expired lease stays listed as offline for the 30 s grace, so this
    # only passes by deregistration, however long the loaded machine takes (the bench times it).
    wait_for(lambda: "promotion-agent" not in cluster.statuses(), timeout=20)
    for _ in range(5):
        assert cluster.reach(promo)["handlerAgentId"] == "price-query-agent"
    assert cluster.agents["promotion-agent"].popen.wait(scaled(5)) == 0
    assert "[reach-client] deregistered agent: promotion-agent" in cluster.agents["promotion-agent"].text()


def test_kill_9_turns_suspect_then_offline(cluster: Cluster) -> None:
    """After kill -9 the agent turns suspect, then offline when its lease runs out, and is not routed."""
    cluster.agents["promotion-agent"].signal(signal.SIGKILL)
    seen: list[str] = []

    def offline() -> bool:
        status = cluster.statuses()["promotion-agent"]
        if not seen or seen[-1] != status:
            seen.append(status)
        return status == "offline"

    wait_for(offline, timeout=20, interval=0.02)
    # The sweep runs every 50 ms and suspect lasts half the TTL (a second or more): it is seen.
    assert seen[-2:] == ["suspect", "offline"]
    promo = {
        "targetTask": "query_promotion",
        "payload": {"product_id": "SKU-1"},
        "preferences": {"filterAgentIds": ["promotion-agent"]},
    }
    body = cluster.reach(promo)
    assert body["status"] == "NO_AVAILABLE_HANDLER"
    reasons = {c["agentId"]: c["reason"] for c in body["error"]["candidates"]}
    assert reasons == {"promotion-agent": "offline", "price-query-agent": "filtered"}


def test_agents_come_back_after_a_router_restart(cluster: Cluster) -> None:
    """After the Router restarts with an empty registry, the agents register again by themselves."""
    assert cluster.router is not None
    cluster.router.stop()
    cluster.start_router()
    wait_for(
        lambda: cluster.statuses() == DEMO_AVAILABLE,
        timeout=20,
    )
    assert cluster.reach(PRICE_CALL)["status"] == "SUCCESS"
    assert "registering again" in cluster.agents["price-query-agent"].text()
